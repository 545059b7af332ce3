"""A Trainer callback that stops at a time bound and times checkpoint saves.

Trainer calls ``on_step_end`` just before it saves and ``on_save`` just after, so
the gap between them is the save (plus logging, which is negligible here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gpudoctor.replay.bounds import Bounds, LoopResult


class BoundsCallback(TrainerCallback):
    def __init__(self, max_seconds: float, output_dir: Path) -> None:
        self.max_seconds = max_seconds
        self.output_dir = output_dir
        self.start = time.perf_counter()
        self.step_end = 0.0
        self.save_s: list[float] = []
        self.save_bytes = 0
        self.stopped_by_time = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_end = time.perf_counter()
        if self.step_end - self.start >= self.max_seconds:
            self.stopped_by_time = True
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.save_s.append(time.perf_counter() - self.step_end)
        folder = self.output_dir / f"checkpoint-{state.global_step}"
        self.save_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    def result(self, state: Any, bounds: Bounds, accum: int, batch_size: int) -> LoopResult:
        losses = [float(h["loss"]) for h in state.log_history if "loss" in h]
        if self.stopped_by_time:
            stopped = "seconds"
        else:
            stopped = "steps" if state.global_step >= bounds.max_steps else "epochs"
        return LoopResult(
            steps=state.global_step,
            micro_steps=state.global_step * accum,
            samples=state.global_step * accum * batch_size,
            seconds=time.perf_counter() - self.start,
            stopped_by=stopped,
            losses=losses,
            checkpoint_s=self.save_s,
            checkpoint_bytes=self.save_bytes,
        )
