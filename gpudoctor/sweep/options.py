"""The one options object of ``gpudoctor sweep``: command line > ``GPUDOCTOR_*`` > defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.sweep.cache import default_root
from gpudoctor.sweep.protocol import Protocol

DEFAULT_MAX_TRIALS = 64
DEFAULT_TRIAL_TIMEOUT_S = 300.0
DEFAULT_NOISE = 0.10
DEFAULT_REPEATS = 1


@dataclass
class SweepOptions:
    config: Path | None
    grid: list[str] = field(default_factory=list)
    hold_global_batch: bool = False
    adaptive: bool = False
    shard: str | None = None
    merge: list[Path] = field(default_factory=list)
    out: Path | None = None
    cache: Path = field(default_factory=default_root)
    max_trials: int = DEFAULT_MAX_TRIALS
    yes: bool = False
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    protocol: Protocol = field(default_factory=Protocol)
    noise: float = DEFAULT_NOISE
    repeats: int = DEFAULT_REPEATS
    target: str | None = None
    price_per_gpu_hour: float | None = None
    gpus: int | None = None
    as_json: bool = False
    quiet: bool = False  # no progress bar (nor without a terminal, with --json or CI set)
    argv: list[str] = field(default_factory=list)
    backend: str = "local"
    ray_address: str | None = None
    study_storage: str | None = None
    search: str = "climb"
    emit_slurm: Path | None = None

    @classmethod
    def from_args(cls, args: Any) -> SweepOptions:
        price = args.price_per_gpu_hour
        if price is None and os.environ.get("GPUDOCTOR_PRICE_PER_GPU_HOUR"):
            price = _env_float("GPUDOCTOR_PRICE_PER_GPU_HOUR")
        opts = cls(
            config=args.config,
            grid=list(args.grid),
            hold_global_batch=args.hold_global_batch,
            adaptive=args.adaptive,
            shard=args.shard,
            merge=list(args.merge or []),
            out=args.out,
            cache=args.cache or default_root(),
            max_trials=args.max_trials,
            yes=args.yes,
            trial_timeout_s=args.trial_timeout,
            protocol=Protocol(args.warmup_s, args.window_s, args.windows, args.torch_threads),
            noise=args.noise,
            repeats=args.repeats,
            target=args.target,
            price_per_gpu_hour=price,
            gpus=args.gpus,
            as_json=args.json,
            quiet=getattr(args, "quiet", False),
            backend=args.backend,
            ray_address=args.ray_address,
            study_storage=args.study_storage,
            search=args.search,
            emit_slurm=args.emit_slurm,
        )
        opts.check()
        return opts

    def check(self) -> None:
        self._check_modes()
        if self.merge:
            if self.config is not None or self.grid:
                raise UserError(
                    "--merge joins finished shards: give only the shard folders and --out"
                )
            return
        if self.config is None:
            raise UserError(
                "no config: gpudoctor sweep CONFIG.yaml --grid KEY=V1,V2 (or --merge DIR...)"
            )
        if self.adaptive and self.shard:
            raise UserError(
                "--adaptive picks its next point from the last ones: it cannot be sharded; drop --shard"
            )
        for name, value in (
            ("--windows", self.protocol.windows),
            ("--max-trials", self.max_trials),
        ):
            if value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")
        for name, number in (
            ("--window-s", self.protocol.window_s),
            ("--trial-timeout", self.trial_timeout_s),
        ):
            if number <= 0:
                raise UserError(f"{name} must be more than 0, got {number:g}")
        if self.repeats < 0:
            raise UserError(f"--repeats must be 0 or more, got {self.repeats}")


    def _check_modes(self) -> None:
        """Options that belong to another way of running, given together: one line each."""
        if self.ray_address and self.backend != "ray":
            raise UserError("--ray-address is for --backend ray: add --backend ray or drop it")
        if self.study_storage and not self.adaptive:
            raise UserError("--study-storage is --adaptive's Optuna storage: add --adaptive or drop it")
        if self.emit_slurm is not None:
            for flag, given in (
                ("--adaptive", self.adaptive),
                ("--shard", self.shard),
                ("--merge", self.merge),
                ("--backend ray", self.backend == "ray"),
            ):
                if given:
                    raise UserError(
                        f"--emit-slurm writes a job array of every point (Slurm runs and merges "
                        f"the shards): drop {flag}"
                    )
        if self.merge and self.backend == "ray":
            raise UserError("--merge runs no trial: drop --backend ray")


def _env_float(name: str) -> float:
    try:
        return float(os.environ[name])
    except ValueError:
        raise UserError(f"{name}={os.environ[name]!r} is not a number") from None
