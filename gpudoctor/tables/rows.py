"""A recording's rows for each table, as plain Python lists (pandas comes after, in frames.py).

Every figure comes from the readers and the analysis the report uses: samples as
:func:`gpudoctor.recording.store.load_recording` cleaned them, spans as
:mod:`gpudoctor.recording.validate` accepts them, and steps cut from the very slices
(:attr:`ProcessView.slices`) that the report's breakdown sums. So a step's data wait is the
breakdown's data wait inside that step, and the steps of a process add up to its breakdown
over the time the steps cover (from its first step's start to its last step's end).
"""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.process import ProcessView
from gpudoctor.analysis.sampled import load_stack_rows, sampled_records, sampled_spans
from gpudoctor.core.events import ProcEvent
from gpudoctor.core.schema import BREAKDOWN_KEYS
from gpudoctor.recording.read import FULL_READ_BYTES, MAX_SAMPLE_ROWS, read_spans
from gpudoctor.tables.columns import COLUMNS, GPU_FIGURES, HOST_FIGURES, STEP_PARTS

Rows = list[dict[str, Any]]


def sample_rows(a: Analysis, run: str) -> Rows:
    """Host ticks, then each GPU of each GPU tick (frames.py orders them by time)."""
    t0 = a.start
    rows: Rows = [{"run": run, "source": "host", "t_s": r["t"] - t0, **{k: r.get(k) for k in HOST_FIGURES}}
                  for r in a.rec.host]
    for r in a.rec.gpu:
        for g in r["gpus"]:
            rows.append({"run": run, "source": "gpu", "t_s": r["t"] - t0, "gpu": g["index"],
                         "gpu_name": g.get("name"), "lost": g["lost"], **{k: g.get(k) for k in GPU_FIGURES}})
    return rows


def sample_notes(root: Path) -> list[str]:
    """The sample files read at evenly spaced rows (as the report reads them), said once each."""
    notes = []
    for name in ("host", "gpu"):
        path = root / "samples" / f"{name}.jsonl"
        size = path.stat().st_size if path.is_file() else 0
        if size > FULL_READ_BYTES:
            notes.append(f"samples/{name}.jsonl is {size / 2**20:.0f} MiB: about {MAX_SAMPLE_ROWS + 1:,} evenly "
                         "spaced rows of it are in the samples table, as in the report")
    return notes


def event_rows(a: Analysis, run: str) -> Rows:
    """Every span of every hooked process (with its name), and those stack samples stand in for."""
    rec, t0 = a.rec, a.start
    rows: Rows = []
    ranks = {p.pid: p.rank for p in a.procs}  # a training process's rank as the analysis reads it
    stacks = load_stack_rows(rec.root, rec.clock)
    sampled = sampled_records(stacks, skip_pids=set(rec.events))
    procs = {pid: r.proc for pid, r in itertools.chain(sampled.items(), rec.events.items()) if r.proc is not None}
    hooked = ((pid, read_spans(rec.root / "events" / f"{pid}.jsonl", rec.clock)) for pid in sorted(rec.events))
    for pid, spans in itertools.chain(hooked, sorted(sampled_spans(stacks, skip_pids=set(rec.events)).items())):
        proc = procs.get(pid, ProcEvent(k="proc"))
        rank, worker = ranks.get(pid, proc.get("rank")), proc.get("is_worker")
        for e in spans:
            start = float(e["t0"]) - t0
            rows.append({"run": run, "pid": pid, "rank": rank if type(rank) is int else None,
                         "worker": worker if type(worker) is bool else None, "category": e["c"],
                         "name": e.get("name"), "start_s": start, "end_s": start + float(e["dt"]),
                         "duration_s": float(e["dt"])})
    rows.sort(key=lambda r: (r["start_s"], r["pid"]))
    return rows


def step_rows(a: Analysis, run: str) -> Rows:
    """One row per optimizer step of each training process: the step's interval (from the
    previous step's end, the first from the first step's start) and the breakdown's data wait,
    checkpoint and eval inside it; compute is the rest, as in the breakdown."""
    rows: Rows = []
    for training, group in enumerate(a.trainings):
        for p in group:
            rows += _process_steps(p, training, run, a.start)
    return rows


def _process_steps(p: ProcessView, training: int, run: str, t0: float) -> Rows:
    ends = sorted(p.step_times)
    if not ends:
        return []
    first = min(max(p.first_step if p.first_step is not None else ends[0], p.start), p.end)
    bounds = [first, *(max(t, first) for t in ends)]
    covered = {k: _covered_until(p.slices.get(k, []), bounds) for k in STEP_PARTS if k != "compute"}
    rows = []
    for i in range(len(ends)):
        duration = bounds[i + 1] - bounds[i]
        parts = {f"{k}_s": covered[k][i + 1] - covered[k][i] for k in covered}
        rows.append({"run": run, "training": training, "pid": p.pid, "rank": p.rank, "step": i + 1,
                     "start_s": bounds[i] - t0, "end_s": bounds[i + 1] - t0, "duration_s": duration,
                     **parts, "compute_s": max(0.0, duration - sum(parts.values()))})
    return rows


def _covered_until(intervals: list[tl.Interval], times: list[float]) -> list[float]:
    """Seconds of ``intervals`` before each of the sorted ``times`` (a prefix sum and a bisect each)."""
    merged = tl.merge(intervals)
    starts = [s for s, _ in merged]
    prefix = [0.0, *itertools.accumulate(e - s for s, e in merged)]
    out = []
    for t in times:
        j = bisect.bisect_right(starts, t)
        out.append(prefix[j] - (max(0.0, merged[j - 1][1] - t) if j else 0.0))
    return out


def breakdown_rows(a: Analysis, run: str) -> Rows:
    """Each training process's breakdown in seconds: the figures the report's shares divide."""
    t0 = a.start
    rows: Rows = []
    for training, group in enumerate(a.trainings):
        for p in group:
            steps = sorted(p.step_times)
            rows.append({
                "run": run, "training": training, "pid": p.pid, "rank": p.rank, "start_s": p.start - t0,
                "end_s": p.end - t0, "wall_s": p.wall_s,
                "first_step_s": p.first_step - t0 if p.first_step is not None else None,
                "last_step_s": steps[-1] - t0 if steps else None, "steps": len(steps),
                **{f"{k}_s": p.seconds(k) for k in BREAKDOWN_KEYS},
            })
    return rows


def empty_rows() -> dict[str, Rows]:
    return {name: [] for name in COLUMNS}
