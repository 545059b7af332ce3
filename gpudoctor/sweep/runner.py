"""Evaluate points: from the cache, else one trial process at a time, measuring a
noisy point again; ``on_change`` rewrites ``sweep.json`` (and the pages) after
every point, so an interrupted or failing sweep keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.sweep.cache import TrialCache
from gpudoctor.sweep.costs import point_cost
from gpudoctor.sweep.points import Resolved
from gpudoctor.sweep.record import build_record
from gpudoctor.sweep.trial import TrialRun, run_trial
from gpudoctor.sweep.windows import Protocol

# What the replay's prepared data depends on: one preparation per distinct value.
PREPARE_KEYS = ("dataset", "text", "tokenizer", "max_length", "padding")


@dataclass
class Runner:
    cache: TrialCache
    protocol: Protocol
    timeout_s: float
    noise: float
    repeats: int
    nvml: Any
    cost_args: dict[str, Any]
    on_change: Callable[[], None]
    display: Any = None
    trials_run: int = 0
    _prepared: dict[str, str | None] = field(default_factory=dict)

    def evaluate(self, item: Resolved) -> dict[str, Any]:
        """Fill ``item.entry`` from the cache or from new trials; return it."""
        entry = item.entry
        if item.point.skip or item.cfg is None or item.key is None:
            entry.update(status="skipped", reason=item.point.skip)
            return self._done(entry, counted=False)
        record = self.cache.load(item.key)
        entry["cached"] = record is not None
        if record is None:
            record = self._measure(item, item.cfg, item.key)
        self._fill(entry, record, item.cfg)
        return self._done(entry, counted=not entry["cached"])

    def _done(self, entry: dict[str, Any], counted: bool) -> dict[str, Any]:
        self.on_change()
        if self.display is not None:
            self.display.point(entry, counted)
        return entry

    def _measure(self, item: Resolved, cfg: ReplayConfig, key: str) -> dict[str, Any]:
        """Run the point, again while its windows disagree by more than ``noise``."""
        folder = self.cache.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        config_yaml = folder / "config.yaml"
        config_yaml.write_text(item.yaml_text or "")
        failed = self._prepare(cfg, config_yaml)
        if failed:
            return {"key": key, "status": "crashed", "reason": failed, "metrics": None}
        runs: list[tuple[str, TrialRun]] = []
        batch = cfg.training.per_device_train_batch_size
        for attempt in range(1 + self.repeats):
            if self.display is not None:
                self.display.running(item.entry["label"], attempt)
            run_dir = _free_dir(folder)
            self.trials_run += 1
            run = run_trial(config_yaml, run_dir, self.protocol, self.timeout_s, batch, self.nvml)
            runs.append((run_dir.name, run))
            record = build_record(key, runs, cfg, gpu_name_of(self.nvml))
            spread = (record.get("metrics") or {}).get("spread")
            if record["status"] != "ok" or spread is None or spread <= self.noise:
                break
        self.cache.save(record)
        return record

    def _prepare(self, cfg: ReplayConfig, config_yaml: Path) -> str | None:
        """Build the replay's data cache, once per distinct input side; the error if it fails.

        Unmeasured and before the trial, as ``gpudoctor replay`` does: preparing is
        this tool's setup, not the config's startup.
        """
        body = {k: _plain(getattr(cfg, k)) for k in PREPARE_KEYS}
        key = json.dumps({**body, "examples": cfg.replay.examples}, sort_keys=True, default=str)
        if key not in self._prepared:
            self._prepared[key] = _prepare_once(config_yaml, self.timeout_s)
        return self._prepared[key]

    def _fill(self, entry: dict[str, Any], record: dict[str, Any], cfg: ReplayConfig) -> None:
        entry.update(status=record["status"], reason=record.get("reason"), key=record["key"])
        entry.update(metrics=record.get("metrics"), device=record.get("device"))
        if record["status"] != "ok" or not record.get("metrics"):
            return
        measure = self.cache.measure(record)
        device, gpu = record.get("device"), record.get("gpu_name")
        try:
            entry["cost"] = point_cost(
                cfg, record["metrics"], measure, device, gpu, **self.cost_args
            )
        except UserError as exc:  # preflight cannot price this config: say so, keep the figures
            entry["cost"], entry["reason"] = None, f"not priced: {exc}"


def _prepare_once(config_yaml: Path, timeout_s: float) -> str | None:
    cmd = [sys.executable, "-m", "gpudoctor.replay.worker", str(config_yaml), "--prepare-only"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"preparing the data took longer than --trial-timeout {timeout_s:g} s"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    last = lines[-1].removeprefix("gpudoctor: ") if lines else f"exit code {proc.returncode}"
    return "preparing the data failed: " + last.replace(f"{config_yaml}:", "line ")


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _free_dir(folder: Path) -> Path:
    n = 1
    while (folder / f"run-{n}").exists():
        n += 1
    return folder / f"run-{n}"


def gpu_name_of(nvml: Any) -> str | None:
    return None if nvml is None or not nvml.indices else nvml.name(nvml.indices[0])
