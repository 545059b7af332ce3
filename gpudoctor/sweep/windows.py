"""Steady-state throughput from a trial's in-process events, warm-up excluded.

The hooks write one ``data_wait`` span per ``DataLoader.__next__`` and a
``batch`` event with each training batch's non-pad lengths (see
:mod:`gpudoctor.core.events`). A batch's arrival is when the loop consumed
it, so arrivals per second after the warm-up is the training rate. Worker start,
model build and the first batches fall in the warm-up and are dropped; the rest
is cut into equal time windows whose boundaries sit on arrivals, so no window
counts a fraction of a batch. The events come through :mod:`gpudoctor.recording.read`
(its validator drops a malformed line); the rest are pure functions of them.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.analysis import steady, step_noise
from gpudoctor.common import batchlengths
from gpudoctor.core.events import BatchEvent
from gpudoctor.recording.read import EventLoad, read_events
from gpudoctor.sweep.protocol import Protocol

MIN_NOISE_STEPS = 4  # step intervals needed for a noise figure from them


@dataclass(frozen=True, order=True)
class Arrival:
    t: float
    rows: float
    tokens: float | None
    padded: float | None


def read_trial(run_dir: Path, pid: int) -> TrialEvents:
    """``events/<pid>.jsonl`` through the recording's reader: checked by its validator, a line
    cut by a kill or garbled counted there, never parsed here."""
    return from_load(read_events(run_dir / "events" / f"{pid}.jsonl"))


@dataclass
class TrialEvents:
    """What the windows read of a trial: batch events, data-wait spans and step times."""

    batches: list[BatchEvent] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)  # (start, end), epoch s
    steps: list[float] = field(default_factory=list)

    @property
    def batch_count(self) -> int:
        return max(len(self.batches), len(self.waits))


def from_load(load: EventLoad) -> TrialEvents:
    return TrialEvents(
        batches=[e for e in load.records.batches if "t" in e],
        waits=list(load.loop.spans.get("data_wait", [])),
        steps=list(load.loop.steps),
    )


def arrivals(events: TrialEvents, batch_size: int) -> list[Arrival]:
    """Batches the training loop received: ``batch`` events, else ``data_wait`` spans.

    The hooks stop writing a ``batch`` event for every batch after a few thousand;
    then each ``__next__`` counts the mean rows and tokens of the events there are.
    Batches that are not tensors (tokenization in the loop) have no ``batch`` event:
    each counts ``batch_size`` rows, tokens unknown.
    """
    batches, spans = events.batches, events.waits
    sizes = [
        (batchlengths.rows(e), e["tokens"] - e["pad"], e["tokens"])
        for e in batches
    ]
    if batches and len(batches) >= 0.9 * len(spans):
        return sorted(Arrival(float(e["t"]), *size) for e, size in zip(batches, sizes, strict=True))
    if sizes:
        rows, tokens, padded = (statistics.fmean(col) for col in zip(*sizes, strict=True))
        return sorted(Arrival(end, rows, tokens, padded) for _, end in spans)
    return sorted(Arrival(end, batch_size, None, None) for _, end in spans)


def _boundaries(times: list[float], first: int, count: int) -> list[int]:
    """Indices of arrivals closest to ``count`` equal time cuts from ``first`` to the last."""
    t0, t1 = times[first], times[-1]
    cuts = [first]
    for k in range(1, count + 1):
        target = t0 + (t1 - t0) * k / count
        i = min(range(cuts[-1] + 1, len(times)), key=lambda j: abs(times[j] - target), default=None)
        if i is None:
            break
        cuts.append(i)
    return cuts


def _overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)


def steady_state(
    events: TrialEvents, batch_size: int, protocol: Protocol
) -> dict[str, Any] | None:
    """Per-window and median figures of one trial run, or None without two steady batches."""
    warmed = _warmed_up(events, batch_size, protocol)
    if warmed is None or warmed[2] >= len(warmed[1]) - 1:
        return None
    arr, times, first = warmed
    waits = events.waits
    cuts = _boundaries(times, first, protocol.windows)
    windows = [
        _window(arr[a + 1 : b + 1], times[a], times[b], waits, times[0])
        for a, b in itertools.pairwise(cuts)
        if times[b] > times[a]
    ]
    if not windows:
        return None
    steps = [t for t in sorted(events.steps) if times[first] <= t <= times[-1]]
    return {
        "first_batch_t": times[0],
        "steady_from_s": times[first] - times[0],
        "steady_s": times[-1] - times[first],
        "batches": len(arr) - first - 1,
        "windows": windows,
        "step_intervals_s": [b - a for a, b in itertools.pairwise(steps)],
    }


def early_rate(events: TrialEvents, batch_size: int, protocol: Protocol) -> tuple[int, float] | None:
    """While a trial runs: whole windows since the warm-up and samples/s over them (for pruning).

    None before the first window is whole. The final figures come from :func:`steady_state`.
    """
    warmed = _warmed_up(events, batch_size, protocol)
    if warmed is None:
        return None
    arr, times, first = warmed
    done = int((times[-1] - times[first]) // protocol.window_s)
    if done < 1:
        return None
    end_t = times[first] + done * protocol.window_s
    inside = [a for a in arr[first + 1 :] if a.t <= end_t]
    last = inside[-1].t if inside else times[first]
    if last <= times[first]:
        return None
    return done, sum(a.rows for a in inside) / (last - times[first])


def _warmed_up(
    events: TrialEvents, batch_size: int, protocol: Protocol
) -> tuple[list[Arrival], list[float], int] | None:
    """The batch arrivals, their times and the index of the first one after the warm-up
    (:mod:`gpudoctor.analysis.steady`, with the protocol's warm-up seconds)."""
    arr = arrivals(events, batch_size)
    times = [a.t for a in arr]
    first = steady.warm_start(times, protocol.warmup_s)
    return None if first is None else (arr, times, first)


def _window(
    arr: list[Arrival], a: float, b: float, waits: list[tuple[float, float]], origin: float
) -> dict[str, Any]:
    dt = b - a
    rows = sum(x.rows for x in arr)
    tokens = None if any(x.tokens is None for x in arr) else sum(x.tokens or 0 for x in arr)
    padded = None if any(x.padded is None for x in arr) else sum(x.padded or 0 for x in arr)
    return {
        "t0_s": a - origin,
        "dt_s": dt,
        "batches": len(arr),
        "samples": rows,
        "samples_per_s": rows / dt,
        "nonpad_tokens_per_s": None if tokens is None else tokens / dt,
        "pad_fraction": None if not padded or tokens is None else 1.0 - tokens / padded,
        "data_wait_share": _overlap(waits, a, b) / dt,
    }


def combine(runs: list[dict[str, Any]], accumulation: int, batch_size: int) -> dict[str, Any]:
    """Median figures over the windows of every run of a point, and their spread."""
    wins = [w for r in runs for w in r["windows"]]
    rates = [w["samples_per_s"] for w in wins]
    median_rate = statistics.median(rates)
    intervals = [s for r in runs for s in r["step_intervals_s"]]
    step_s = (
        statistics.median(intervals)
        if len(intervals) >= 2
        else accumulation * batch_size / median_rate
    )
    noise, noise_from = _noise(intervals, rates, median_rate)
    return {
        "samples_per_s": median_rate,
        "nonpad_tokens_per_s": _median(w["nonpad_tokens_per_s"] for w in wins),
        "step_time_s": step_s,
        "step_time_from": "steps" if len(intervals) >= 2 else "samples_per_s",
        "data_wait_share": _median(w["data_wait_share"] for w in wins),
        "pad_fraction": _median(w["pad_fraction"] for w in wins),
        "spread": (max(rates) - min(rates)) / median_rate if median_rate else None,
        "noise": noise,
        "noise_from": noise_from,
        "windows_samples_per_s": rates,
        "batches": sum(w["batches"] for w in wins),
        "steady_s": sum(w["dt_s"] for w in wins),
        "runs": len(runs),
    }


def _noise(
    intervals: list[float], rates: list[float], median_rate: float
) -> tuple[float | None, str | None]:
    """The point's relative noise: the step-time noise of :mod:`gpudoctor.analysis.step_noise` (robust
    spread and drift of its own step intervals) over the median step; without steps enough,
    half the windows' spread. The same estimator as ``gpudoctor diff``'s, so a sweep's "tied"
    and a diff's "within the noise" mean the same thing."""
    if len(intervals) >= MIN_NOISE_STEPS:
        # step_noise reads a report's step times; the intervals laid end to end are those.
        times = list(itertools.accumulate(intervals, initial=0.0))
        est = step_noise.estimate({"timeline": {"steps_t_s": times}})
        median = statistics.median(intervals)
        if est.noise_s is not None and median > 0:
            return est.noise_s / median, "step_intervals"
    if len(rates) >= 2 and median_rate:
        return (max(rates) - min(rates)) / median_rate / 2, "windows"
    return None, None


def _median(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None
