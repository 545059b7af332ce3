"""Steady-state throughput from a trial's in-process events, warm-up excluded.

The hooks write one ``data_wait`` span per ``DataLoader.__next__`` and a
``batch`` event with each training batch's non-pad lengths (see
:mod:`gpudoctor.recording.events`). A batch's arrival is when the loop consumed
it, so arrivals per second after the warm-up is the training rate. Worker start,
model build and the first batches fall in the warm-up and are dropped; the rest
is cut into equal time windows whose boundaries sit on arrivals, so no window
counts a fraction of a batch. Pure functions: the tests feed them events.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIN_WARMUP_BATCHES = 2


@dataclass(frozen=True)
class Protocol:
    """How a trial is measured; part of the cache key.

    ``torch_threads`` caps the trial's intra-op threads (``OMP_NUM_THREADS``; None:
    PyTorch's default). On a CPU box the replay's model is a stand-in for GPU work,
    and two spinning OpenMP threads fighting DataLoader workers for two cores made
    steps 5-40x slower and noisy; one thread leaves the cores to the input side,
    as a GPU would.
    """

    warmup_s: float = 2.0
    window_s: float = 2.0
    windows: int = 3
    torch_threads: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def train_s(self) -> float:
        """Training seconds to ask of the worker: warm-up, the windows, a margin for the first batch."""
        return self.warmup_s + self.windows * self.window_s + 1.0


@dataclass(frozen=True, order=True)
class Arrival:
    t: float
    rows: float
    tokens: float | None
    padded: float | None


def read_events(run_dir: Path, pid: int) -> list[dict[str, Any]]:
    """``events/<pid>.jsonl``; a line cut by a kill is skipped."""
    path = run_dir / "events" / f"{pid}.jsonl"
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def arrivals(events: list[dict[str, Any]], batch_size: int) -> list[Arrival]:
    """Batches the training loop received: ``batch`` events, else ``data_wait`` spans.

    The hooks stop writing a ``batch`` event for every batch after a few thousand;
    then each ``__next__`` counts the mean rows and tokens of the events there are.
    Batches that are not tensors (tokenization in the loop) have no ``batch`` event:
    each counts ``batch_size`` rows, tokens unknown.
    """
    batches = [e for e in events if e.get("k") == "batch"]
    spans = [e for e in events if e.get("k") == "span" and e.get("c") == "data_wait"]
    sizes = [
        (len(e.get("lengths") or []), sum(e.get("lengths") or []), int(e.get("tokens") or 0))
        for e in batches
    ]
    if batches and len(batches) >= 0.9 * len(spans):
        return sorted(Arrival(float(e["t"]), *size) for e, size in zip(batches, sizes, strict=True))
    if sizes:
        rows, tokens, padded = (statistics.fmean(col) for col in zip(*sizes, strict=True))
        return sorted(Arrival(float(e["t0"]) + float(e["dt"]), rows, tokens, padded) for e in spans)
    return sorted(Arrival(float(e["t0"]) + float(e["dt"]), batch_size, None, None) for e in spans)


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
    events: list[dict[str, Any]], batch_size: int, protocol: Protocol
) -> dict[str, Any] | None:
    """Per-window and median figures of one trial run, or None without two steady batches."""
    arr = arrivals(events, batch_size)
    if len(arr) < MIN_WARMUP_BATCHES + 2:
        return None
    times = [a.t for a in arr]
    start_t = times[0] + protocol.warmup_s
    first = next((i for i, t in enumerate(times) if t >= start_t and i >= MIN_WARMUP_BATCHES), None)
    if first is None or first >= len(times) - 1:
        return None
    waits = [
        (float(e["t0"]), float(e["t0"]) + float(e["dt"]))
        for e in events
        if e.get("k") == "span" and e.get("c") == "data_wait"
    ]
    cuts = _boundaries(times, first, protocol.windows)
    windows = [
        _window(arr[a + 1 : b + 1], times[a], times[b], waits, times[0])
        for a, b in itertools.pairwise(cuts)
        if times[b] > times[a]
    ]
    if not windows:
        return None
    steps = [
        float(e["t"])
        for e in events
        if e.get("k") == "step" and times[first] <= float(e["t"]) <= times[-1]
    ]
    return {
        "first_batch_t": times[0],
        "steady_from_s": times[first] - times[0],
        "steady_s": times[-1] - times[first],
        "batches": len(arr) - first - 1,
        "windows": windows,
        "step_intervals_s": [b - a for a, b in itertools.pairwise(steps)],
    }


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
    return {
        "samples_per_s": median_rate,
        "nonpad_tokens_per_s": _median(w["nonpad_tokens_per_s"] for w in wins),
        "step_time_s": step_s,
        "step_time_from": "steps" if len(intervals) >= 2 else "samples_per_s",
        "data_wait_share": _median(w["data_wait_share"] for w in wins),
        "pad_fraction": _median(w["pad_fraction"] for w in wins),
        "spread": (max(rates) - min(rates)) / median_rate if median_rate else None,
        "windows_samples_per_s": rates,
        "batches": sum(w["batches"] for w in wins),
        "steady_s": sum(w["dt_s"] for w in wins),
        "runs": len(runs),
    }


def _median(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None
