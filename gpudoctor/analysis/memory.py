"""Memory over the training loop: does it grow steadily, and when does it run out at that rate?

A run that leaks (a list that keeps every loss tensor and its graph, workers that cache items,
an ever-longer autograd graph) trains at full speed until it is killed hours later; its samples
said so from the first minutes. From what the samplers already record, with no new hook:

* the host: the training process tree's resident memory (``rss_mib``: main process and
  DataLoader workers together), against what the machine had available (``mem_available_mib``);
* the GPU: the training processes' memory per NVML (``proc_mem_mib``, summed over the GPUs;
  the device's whole ``mem_used_mib`` where NVML does not list the processes), against the
  device's total;
* on CUDA, the caching allocator at step ends (``cuda_mem`` lines, :mod:`gpudoctor.hooks.cuda_memory`):
  *allocated* (live tensors) and *reserved* (those and the cached blocks), which tell what grows:
  allocated growing is tensors kept across steps, reserved growing over a flat allocated is the cache.

Only the training loop counts (first step to last), less its warm-up (its first third, at most two
minutes): loading a model, forking DataLoader workers and warming the allocator up are growth that stops. A trend is *steady* when a straight line explains the samples
(R² ≥ :data:`MIN_R2`), the second half of the loop grows at least half as fast as the whole
(not a ramp that levels off), both against the steps done where the steps were timed (a leak is
per step: a loop a busy host slows leaks less per second, as much per step), and it grew by at least :data:`MIN_GROWTH_MIB` and either
:data:`MIN_GROWTH_SHARE` of where it started or at a rate that runs out within :data:`SOON_H`.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis.model import Analysis
from gpudoctor.common import batchlengths
from gpudoctor.recording.read import AllocatorSample, allocator_samples

MIN_SAMPLES = 8  # a line through fewer says little; a busy host samples once a second (samplers/pace.py)
MIN_LOOP_S = 5.0
MIN_R2 = 0.8
MIN_GROWTH_MIB = 64.0
MIN_GROWTH_SHARE = 0.10
MIN_LATE_SLOPE = 0.5  # the second half's slope over the whole's: below it, growth is levelling off
SOON_H = 72.0  # growth that runs out within this many hours matters, however small against the start
WARMUP_SHARE = 1 / 3  # the loop's first third is left out of the line (DataLoader workers forking, the
WARMUP_MAX_S = 120.0  # allocator's first steps: a jump that stops), at most its first two minutes


@dataclass(frozen=True)
class Trend:
    """A straight line through one memory series over the training loop."""

    what: str  # "host" | "gpu" (NVML) | "cuda_allocated" | "cuda_reserved" (the allocator's)
    samples: int
    loop_s: float
    start_mib: float  # the line at the loop's start and end
    end_mib: float
    slope_mib_per_h: float
    r2: float  # of the line against the steps done where known (a leak is per step), else against time
    late_ratio: float  # the second half's slope over the whole's, on the same axis
    limit_mib: float | None  # what it can still grow by: the host's available memory, the GPU's free
    limit_what: str

    @property
    def growth_mib(self) -> float:
        return self.end_mib - self.start_mib

    @property
    def steady(self) -> bool:
        """A line, still rising in its second half, by enough to matter: a tenth of where it began, or
        a rate that uses up what is left within :data:`SOON_H` (a large process that leaks fast)."""
        left = self.hours_left
        return (self.r2 >= MIN_R2 and self.late_ratio >= MIN_LATE_SLOPE and self.growth_mib >= MIN_GROWTH_MIB
                and (self.growth_mib >= MIN_GROWTH_SHARE * max(self.start_mib, 1.0)
                     or (left is not None and left <= SOON_H)))

    @property
    def hours_left(self) -> float | None:
        """At this rate, hours until the limit is reached (None: no limit known, or not growing)."""
        if self.limit_mib is None or self.slope_mib_per_h <= 0:
            return None
        return max(0.0, self.limit_mib) / self.slope_mib_per_h


def _window(a: Analysis) -> tuple[float, float] | None:
    """The training loop less its warm-up: workers starting, caches filling are growth that stops."""
    p = a.primary
    if p is None or p.first_step is None or not p.step_times:
        return None
    lo, hi = p.first_step, max(p.step_times)
    if hi - lo < MIN_LOOP_S:
        return None
    return lo + min(WARMUP_SHARE * (hi - lo), WARMUP_MAX_S), hi


def trends(a: Analysis) -> list[Trend]:
    """The host's, the GPU's (NVML) and the allocator's memory trends over the loop, where there are
    enough samples."""
    window = _window(a)
    if window is None:
        return []
    lo, hi = window
    out = []
    steps = _steps_done(a)
    host = [r for r in a.rec.host if lo <= r.get("t", 0.0) <= hi]
    trend = _fit("host", host, lambda r: _num(r.get("rss_mib")), _host_headroom, "the memory the host had available",
                 steps)
    if trend is not None:
        out.append(trend)
    gpu = [r for r in a.rec.gpu if lo <= r.get("t", 0.0) <= hi]
    trend = _fit("gpu", gpu, _gpu_mib, _gpu_headroom, "the GPU memory free", steps)
    if trend is not None:
        out.append(trend)
    return out + _allocator_trends(a, lo, hi, steps)


def _steps_done(a: Analysis) -> Callable[[float], float] | None:
    """Steps the loop had finished by a time: the axis a leak per step is a line on. A loop a busy
    host slowed mid-run leaks as much per step and less per second (CI: a leak's second half grew
    0.47 as fast in time as its whole, at one rate per step); None without step times."""
    p = a.primary
    ends = sorted(p.step_times) if p is not None else []
    if len(ends) < MIN_SAMPLES:
        return None
    return lambda t: float(bisect.bisect_right(ends, t))


def _allocator_trends(a: Analysis, lo: float, hi: float, steps: Callable[[float], float] | None) -> list[Trend]:
    samples = allocator(a)
    if not samples:
        return []
    free = _allocator_free(a, samples)
    rows = [{"t": s.t, "cuda_allocated": s.allocated_mib, "cuda_reserved": s.reserved_mib, "free": free}
            for s in samples if lo <= s.t <= hi]
    out = []
    for what in ("cuda_allocated", "cuda_reserved"):
        trend = _fit(what, rows, _field(what), _field("free"), "the GPU memory free", steps)
        if trend is not None:
            out.append(trend)
    return out


def _field(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda row: _num(row.get(key))


def allocator(a: Analysis) -> list[AllocatorSample]:
    """The primary process's allocator lines (none on a CPU run or an older recording)."""
    return allocator_samples(a.primary.records) if a.primary is not None else []


def _allocator_free(a: Analysis, samples: list[AllocatorSample]) -> float | None:
    """What the GPU has left: NVML's free at its last sample, else torch's total less reserved."""
    last = next((h for r in reversed(a.rec.gpu) if (h := _gpu_headroom(r)) is not None), None)
    if last is not None:
        return last
    total = device_total_mib(a, samples)
    return total - samples[-1].reserved_mib if total is not None else None


def device_total_mib(a: Analysis, samples: list[AllocatorSample]) -> float | None:
    """The device's memory: torch's figure from the allocator's first line, else NVML's."""
    total = next((s.total_mib for s in samples if s.total_mib), None)
    return total if total is not None else a.gpu.mem_total_mib


def gpu_kind(steady: Sequence[Trend]) -> str | None:
    """What grows on the GPU, by the allocator: ``"tensors"`` (allocated grows: tensors kept across
    steps, an ever-longer autograd graph), ``"cache"`` (reserved grows while allocated does not: cached
    blocks, fragmentation), None (no allocator figures, or neither grows)."""
    whats = {t.what for t in steady}
    if "cuda_allocated" in whats:
        return "tensors"
    return "cache" if "cuda_reserved" in whats else None


def _fit(what: str, rows: Sequence[dict[str, Any]], value: Callable[[dict[str, Any]], float | None],
         headroom: Callable[[dict[str, Any]], float | None], limit_what: str,
         steps: Callable[[float], float] | None = None) -> Trend | None:
    """The line in time (its rate, the hours left) and whether it is one: R² and the second half's
    slope against the steps done where they are known (a leak is per step), else against time."""
    points = _median3([(float(r["t"]), v) for r in rows if (v := value(r)) is not None])
    if len(points) < MIN_SAMPLES:
        return None
    ts = [t for t, _ in points]
    loop_s = ts[-1] - ts[0]
    if loop_s < MIN_LOOP_S:
        return None
    line = _line(points)
    slope, intercept, _ = line
    axis = [(steps(t), v) for t, v in points] if steps is not None else points
    if axis[-1][0] <= axis[0][0]:  # no step in the window: time is the only axis
        axis = points
    whole, _, shape_r2 = line if axis is points else _line(axis)
    half = [pt for pt in axis if pt[0] >= axis[0][0] + (axis[-1][0] - axis[0][0]) / 2]
    late = _line(half)[0] if len(half) >= MIN_SAMPLES // 2 else whole
    last = next((h for r in reversed(rows) if (h := headroom(r)) is not None), None)
    return Trend(what, len(points), loop_s, intercept + slope * ts[0], intercept + slope * ts[-1], slope * 3600.0,
                 shape_r2, late / whole if whole > 0 else 0.0, last, limit_what)


def _median3(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each value the median of it and its neighbours: one sample off the line (a worker whose RSS
    a tick could not read, a transient buffer) is the sampler's, not the trend's. The two ends by
    Tukey's end-point rule, the median of the end, its smoothed neighbour and the line through the next
    two carried out to it: an end on the line stays where it is, an end off it (the workers gone from the
    tick the loop's last step shared, stamped before it read them: a clean-clone CI) is moved back onto it."""
    if len(points) < 3:
        return points
    vs = [v for _, v in points]
    mid = [sorted(vs[i - 1:i + 2])[1] for i in range(1, len(vs) - 1)]
    if len(mid) >= 2:
        first = sorted((vs[0], mid[0], 3 * mid[0] - 2 * mid[1]))[1]
        last = sorted((vs[-1], mid[-1], 3 * mid[-1] - 2 * mid[-2]))[1]
    else:
        first, last = vs[0], vs[-1]
    return [(points[0][0], first), *((t, m) for (t, _), m in zip(points[1:-1], mid, strict=True)),
            (points[-1][0], last)]


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares: (slope per second, intercept, R²); a flat series explains itself (R² 1)."""
    ts = [t for t, _ in points]
    vs = [v for _, v in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    stt = sum((t - mt) ** 2 for t in ts)
    if stt <= 0:
        return 0.0, mv, 0.0
    slope = sum((t - mt) * (v - mv) for t, v in points) / stt
    intercept = mv - slope * mt
    svv = sum((v - mv) ** 2 for v in vs)
    resid = sum((v - (intercept + slope * t)) ** 2 for t, v in points)
    return slope, intercept, 1.0 - resid / svv if svv > 0 else 1.0


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _host_headroom(row: dict[str, Any]) -> float | None:
    return _num(row.get("mem_available_mib"))


def _gpus(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in row.get("gpus") or [] if isinstance(g, dict) and not g.get("lost")]


def _gpu_mib(row: dict[str, Any]) -> float | None:
    """The training processes' GPU memory (NVML's per-process figure), else the devices' used."""
    gpus = _gpus(row)
    procs = [v for g in gpus if (v := _num(g.get("proc_mem_mib"))) is not None]
    if procs and any(v > 0 for v in procs):
        return sum(procs)
    used = [v for g in gpus if (v := _num(g.get("mem_used_mib"))) is not None]
    return sum(used) if used else None


def _gpu_headroom(row: dict[str, Any]) -> float | None:
    """The least free memory of any GPU: the first to run out ends the run."""
    free = [t - u for g in _gpus(row)
            if (t := _num(g.get("mem_total_mib"))) is not None and (u := _num(g.get("mem_used_mib"))) is not None]
    return min(free) if free else None


def series_mib(rows: Sequence[dict[str, Any]], what: str) -> list[float | None]:
    """One memory series for the report's timeline: the host's tree RSS or the GPU's memory."""
    return [_gpu_mib(r) if what == "gpu" else _num(r.get("rss_mib")) for r in rows]


# ---- the peak of a step, and of a step with more work -----------------------------------------
SAFE_SHARE = 0.90  # a fix is prescribed only when its predicted peak stays under this share of the device


@dataclass(frozen=True)
class StepMemory:
    """The allocator's peak split into what every step holds and what grows with its batch.

    ``static_mib``: allocated at the step ends after the first (weights, gradients, optimizer state
    and the last batch): the least of them, so a leak does not count as static. The activations are
    the peak over that, spread over the widest batch's rows and tokens: a fix that scales the work
    per step by ``s`` peaks at about ``static + s × activations`` (linear in the rows; attention kept
    in memory grows faster with longer rows, so a longer row is predicted low, a shorter one high).
    """

    static_mib: float
    peak_mib: float
    rows: int | None  # rows of the widest micro-batch seen
    tokens: int | None  # its padded tokens (rows × width)
    total_mib: float
    overhead_mib: float  # what NVML counts on the device beyond the allocator's reserved (context, others)

    @property
    def activation_mib(self) -> float:
        return max(0.0, self.peak_mib - self.static_mib)

    @property
    def limit_mib(self) -> float:
        """What the allocator may reach: :data:`SAFE_SHARE` of the device, less what is not its own."""
        return SAFE_SHARE * self.total_mib - self.overhead_mib

    def predicted_peak_mib(self, scale: float) -> float:
        return self.static_mib + scale * self.activation_mib

    def headroom_mib(self, scale: float) -> float:
        return self.limit_mib - self.predicted_peak_mib(scale)

    def largest_factor(self, at_most: int) -> int:
        """The largest power of two ≤ ``at_most`` whose batch × k still fits (1: not even ×2)."""
        k = 1
        while 2 * k <= at_most and self.headroom_mib(2 * k) >= 0:
            k *= 2
        return k


def step_memory(a: Analysis) -> StepMemory | None:
    """The measured split of the step's peak (None without allocator lines: a CPU run, no CUDA hooks)."""
    samples = allocator(a)
    total = device_total_mib(a, samples) if samples else None
    if not samples or total is None:
        return None
    after_first = [s for s in samples if s.n is None or s.n >= 2] or samples
    static = min(s.allocated_mib for s in after_first)
    peak = max(s.peak_mib for s in samples)
    rows, tokens = _widest_batch(a)
    used = [sum(v for g in _gpus(r) if (v := _num(g.get("mem_used_mib"))) is not None) for r in a.rec.gpu]
    overhead = max(0.0, max(used) - max(s.reserved_mib for s in samples)) if used else 0.0
    return StepMemory(static, peak, rows, tokens, total, overhead)


def _widest_batch(a: Analysis) -> tuple[int | None, int | None]:
    """(rows, padded tokens) of the widest training batch recorded, else the loader's batch size."""
    p = a.primary
    batches = [b for q in a.procs for b in q.batches]
    if batches:
        widest = max(batches, key=lambda b: int(b["tokens"]))
        rows = batchlengths.rows(widest) or max(1, int(widest["tokens"]) // max(1, int(widest["seq_len"])))
        return rows, rows * int(widest["seq_len"])
    sizes = [int(b) for e in (p.loaders if p else []) if isinstance(b := e.get("batch_size"), int)]
    return (max(sizes), None) if sizes else (None, None)
