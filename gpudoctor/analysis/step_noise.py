"""How much a run's seconds per step move by themselves: the noise a before/after diff must beat.

Two runs of the same code never have the same step time. The noise is estimated
from each run's own step intervals, robustly (a few checkpoint or eval steps do
not widen it):

* ``spread_s``: 1.4826 × the median absolute deviation of the intervals, the
  per-step spread (a standard deviation for normal jitter);
* ``drift_s``: half the range of the medians of four consecutive blocks of
  steps, how far the run's own median wanders over time (warm-up, throttling,
  a neighbour on the machine), which the spread of single steps does not show;
* ``noise_s``: the larger of the median's standard error
  (1.2533 × spread / √n) and the drift.

A change counts only beyond ``threshold_s = 2·√(noise_before² + noise_after²)``.
Reports that kept only ``steps.step_time_s`` p50/p90 get a normal-jitter spread
from those (no drift: it says so in ``method``). No step times: no noise, and
the diff calls every change unavailable rather than guessing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpudoctor.common.numbers import num

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation, normal jitter
MEDIAN_SE = 1.2533  # standard error of a median / (sigma / sqrt(n)), normal jitter
P90_Z = 1.2816  # the 90th percentile of a normal lies 1.2816 sigma above its median
BLOCKS = 4
Z = 2.0


@dataclass(frozen=True)
class StepNoise:
    """One run's step-time noise; every figure None when it could not be observed."""

    method: str  # "step_times", "p50_p90" or "unavailable"
    steps: int
    spread_s: float | None = None
    drift_s: float | None = None
    noise_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_intervals(report: Mapping[str, Any]) -> list[float]:
    """Per-step intervals from ``timeline.steps_t_s`` (a stored every-k-th step is divided by k)."""
    timeline, steps = report.get("timeline"), report.get("steps")
    stored = timeline.get("steps_t_s") if isinstance(timeline, dict) else None
    times = [t for t in (stored if isinstance(stored, list) else []) if num(t) is not None]
    if len(times) < 2:
        return []
    count = num(steps.get("count")) if isinstance(steps, dict) else None
    stride = max(1, math.ceil(count / len(times))) if count and count > len(times) else 1
    gaps = [(b - a) / stride for a, b in zip(times, times[1:], strict=False)]
    return [g for g in gaps if g > 0]


def estimate(report: Mapping[str, Any]) -> StepNoise:
    """The noise of this run's seconds per step, from the best step data the report holds."""
    intervals = step_intervals(report)
    n = len(intervals)
    if n >= 2:
        median = statistics.median(intervals)
        spread = MAD_TO_SIGMA * statistics.median(abs(x - median) for x in intervals)
        drift = _block_drift(intervals) if n >= 2 * BLOCKS else spread
        noise = max(MEDIAN_SE * spread / math.sqrt(n), drift)
        return StepNoise("step_times", n, spread, drift, noise)
    steps = report.get("steps") or {}
    q = steps.get("step_time_s") or {}
    p50, p90, count = num(q.get("p50")), num(q.get("p90")), num(steps.get("count"))
    if p50 is not None and p90 is not None and count and count >= 3:
        spread = max(0.0, p90 - p50) / P90_Z
        return StepNoise("p50_p90", int(count) - 1, spread, None, MEDIAN_SE * spread / math.sqrt(count - 1))
    return StepNoise("unavailable", n)


def threshold(before: StepNoise, after: StepNoise) -> float | None:
    """The smallest change in seconds per step that is not noise; None when unobservable."""
    if before.noise_s is None or after.noise_s is None:
        return None
    return Z * math.hypot(before.noise_s, after.noise_s)


def _block_drift(intervals: list[float]) -> float:
    size = len(intervals) // BLOCKS
    medians = [statistics.median(intervals[i * size:(i + 1) * size]) for i in range(BLOCKS)]
    return (max(medians) - min(medians)) / 2
