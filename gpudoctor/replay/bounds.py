"""How long a replay trains, and what its loop measured: shared by the plain loop
(:mod:`.loop`) and the Trainer callback (:mod:`.trainer_bounds`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.replay.config import ReplayConfig


@dataclass
class Bounds:
    max_steps: int
    max_seconds: float
    save_steps: int | None


@dataclass
class LoopResult:
    steps: int = 0
    micro_steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    stopped_by: str = "data"
    losses: list[float] = field(default_factory=list)
    checkpoint_s: list[float] = field(default_factory=list)
    checkpoint_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "micro_steps": self.micro_steps,
            "samples": self.samples,
            "seconds": self.seconds,
            "stopped_by": self.stopped_by,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
        }


def replay_bounds(cfg: ReplayConfig, max_steps: int | None, max_seconds: float | None) -> Bounds:
    """Steps/seconds from the CLI or ``replay:``; saving scaled so the replay sees a checkpoint."""
    steps = max_steps or cfg.replay.steps
    if cfg.training.max_steps > 0:
        steps = min(steps, cfg.training.max_steps)
    save = cfg.replay.save_steps
    if save is None and cfg.training.save_steps is not None:
        save = (
            cfg.training.save_steps if cfg.training.save_steps <= steps // 2 else max(1, steps // 2)
        )
    return Bounds(steps, max_seconds or cfg.replay.seconds, save)
