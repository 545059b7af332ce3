"""Steps per second and the GPU's busy share now, from the lines added since the last tick.

Each tick reads only the new bytes (:class:`~gpudoctor.recording.tail.FolderTail`) and keeps a
few hundred step times per process and the last GPU rows: memory stays flat however long the
run. The rate is the lead process's (the one with the most steps: ranks step together, DataLoader
workers never step) over the last :data:`WINDOW_S` seconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.recording.tail import FolderTail

WINDOW_S = 10.0  # steps/s over this much of the latest steps
KEPT_STEPS = 256  # step times kept per process
GPU_ROWS = 5  # busy share now: the mean over the GPUs' last rows


@dataclass
class Pace:
    """What one tick knows: steps, their rate, the GPUs' busy share now (None: not seen)."""

    steps: int = 0
    steps_per_s: float | None = None
    last_step_age_s: float | None = None  # seconds since the lead process's last step
    gpus: int = 0  # GPUs the sampler describes (0: none seen yet, or no GPU)
    gpu_busy_now: float | None = None  # 0-1


@dataclass
class PaceReader:
    """Follows a run folder; :meth:`read` once a tick."""

    folder: Path
    tail: FolderTail = field(init=False)
    counts: dict[str, int] = field(default_factory=dict)
    times: dict[str, deque[float]] = field(default_factory=dict)
    gpu_rows: deque[list[float]] = field(default_factory=lambda: deque(maxlen=GPU_ROWS))
    gpus: int = 0

    def __post_init__(self) -> None:
        self.tail = FolderTail(self.folder)

    def read(self, now: float | None = None) -> Pace:
        now = time.time() if now is None else now
        for name, events in self.tail.read_events().items():
            steps = [e["t"] for e in events if e.get("k") == "step" and isinstance(e.get("t"), (int, float))]
            if steps:
                self.counts[name] = self.counts.get(name, 0) + len(steps)
                self.times.setdefault(name, deque(maxlen=KEPT_STEPS)).extend(steps)
        for row in self.tail.read_gpu():
            self._gpu_row(row)
        return self._pace(now)

    def _gpu_row(self, row: dict[str, Any]) -> None:
        gpus = [g for g in row.get("gpus") or [] if isinstance(g, dict)]
        self.gpus = max(self.gpus, len(gpus))
        utils = [float(g["util_pct"]) / 100 for g in gpus if isinstance(g.get("util_pct"), (int, float))]
        if utils:
            self.gpu_rows.append(utils)

    def _pace(self, now: float) -> Pace:
        busy = [u for row in self.gpu_rows for u in row]
        pace = Pace(gpus=self.gpus, gpu_busy_now=sum(busy) / len(busy) if busy else None)
        if not self.counts:
            return pace
        lead = max(self.counts, key=lambda n: self.counts[n])
        times = self.times[lead]
        pace.steps = self.counts[lead]
        pace.last_step_age_s = max(0.0, now - times[-1])
        pace.steps_per_s = steps_per_s(list(times), now)
        return pace


def steps_per_s(times: list[float], now: float) -> float | None:
    """Steps in the last :data:`WINDOW_S` over the time they cover; with fewer than 3 there, the
    latest intervals (slow steps), falling as the wait for the next step grows. None before 2 steps."""
    if len(times) < 2:
        return None
    recent = [t for t in times if t >= now - WINDOW_S]
    if len(recent) >= 3:
        return len(recent) / min(WINDOW_S, now - times[0])
    last = times[-4:]
    interval = (last[-1] - last[0]) / (len(last) - 1)
    waited = now - last[-1]
    return 1.0 / max(interval, waited) if max(interval, waited) > 0 else None
