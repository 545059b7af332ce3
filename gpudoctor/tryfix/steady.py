"""Steady-state steps/s of two runs, like with like; and what the fix predicts for it.

Startup is left out (a fix that changes steps/s does not change imports), and so are the
first steps of training (DataLoader workers starting, caches warming): each run is measured
from its first steps after the warm-up to the end of the same length of training, so a
bounded trial is compared with the same stretch of the baseline, never with its whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpudoctor.analysis import Analysis, steady
from gpudoctor.core.schema import Rate as RateSection


@dataclass
class Rate:
    steps_per_s: float | None
    steps: int  # steps inside the measured window
    warmup_steps: int
    window_s: float | None

    def to_dict(self) -> RateSection:
        return {"steps_per_s": _r(self.steps_per_s), "steps": self.steps, "warmup_steps": self.warmup_steps,
                "window_s": _r(self.window_s)}


def training_s(a: Analysis) -> float | None:
    """Seconds from the first training step to the last one."""
    p = a.primary
    if p is None or not p.step_times or p.first_step is None:
        return None
    return max(p.step_times) - p.first_step


def steady_rate(a: Analysis, length_s: float | None) -> Rate:
    """Steps/s over ``length_s`` seconds of training (all of it: None), warm-up dropped
    (:mod:`gpudoctor.analysis.steady`, the one definition of steady state)."""
    p = a.primary
    if p is None or not p.step_times or p.first_step is None:
        return Rate(None, 0, 0, None)
    end = p.first_step + length_s if length_s is not None else math.inf
    times = sorted(t for t in p.step_times if t <= end + 1e-9)
    first = steady.warm_start(times)
    if first is None:
        warm = min(len(times), steady.warmup(len(times)))
        return Rate(None, len(times) - warm, warm, None)
    return Rate(steady.rate(times, first), len(times) - first, first, times[-1] - times[first])


def seconds_for(rate: Rate, length_s: float, steady_steps: int) -> float:
    """Seconds of training a run measured as ``rate`` over ``length_s`` needs for ``steady_steps``
    past its warm-up, at the pace it ran (rounded up to ten seconds): what to give ``--seconds``."""
    total = rate.steps + rate.warmup_steps
    per_step = length_s / max(1, total - 1)
    return 10.0 * math.ceil(steady.events_for(steady_steps) * per_step / 10.0)


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None
