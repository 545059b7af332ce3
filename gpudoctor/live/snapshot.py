"""The light analysis behind the live panel: the breakdown and the top finding of the run so far.

It is the report's own analysis and rules over the recording up to its last flushed line (what
the user watches is what the report will say), without the report's pages, prices and
trackers. Its cost grows with the recording, so :class:`Analyst` runs it on its own thread, at
most every :data:`MIN_PERIOD_S` and no more often than :data:`COST_FACTOR` times its own cost:
the doctor's tick (and its samplers) never wait for it, and on a long run the figures simply
come less often, each said with the moment it was computed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.analysis import analyze
from gpudoctor.analysis.sampled import load_stack_rows
from gpudoctor.recording.records import Records
from gpudoctor.recording.store import load_recording
from gpudoctor.rules.catalog import run_rules

MIN_PERIOD_S = 3.0
COST_FACTOR = 100.0  # analysing at most 1% of the time, at the doctor's idle priority


@dataclass(frozen=True)
class Snapshot:
    """The figures of one light analysis; ``at`` is when it was taken (epoch s)."""

    at: float
    breakdown: dict[str, float | None] | None  # None: no training process seen yet
    steps: int
    sampled: bool  # estimated from stack samples only (attach without hooks)
    gpu_busy: float | None  # NVML's mean over the run so far, 0-1
    gpus: int
    top_rule: str | None  # the finding that wastes the most so far, None: none
    top_share: float | None  # the share of wall time its fix gives back
    cost_s: float


def last_data_time(events: dict[int, Records], folder: Path) -> float:
    """Up to the last line flushed, not "now": the unwritten tail would read as idle time."""
    last = [extent[1] for records in events.values() if (extent := records.extent()) is not None]
    if not last:
        last = [r["t1"] for r in load_stack_rows(folder)[-8:] if isinstance(r.get("t1"), float)]
    return max(last) if last else time.time()


def take(folder: Path) -> Snapshot:
    """Analyse the recording so far (the whole folder: the report's reader and its budgets)."""
    t0 = time.perf_counter()
    rec = load_recording(folder)
    rec.meta["end_time"] = last_data_time(rec.events, folder)
    a = analyze(rec)
    breakdown, steps, sampled, top_rule, top_share = None, 0, False, None, None
    if a.procs:
        breakdown = a.breakdown()
        steps = len(a.primary.step_times) if a.primary else 0
        sampled = all(p.proc.get("sampled") for p in a.procs)
        findings, _ = run_rules(a)
        top = next((f for f in findings if f.severity != "info" and not f.risk and f.waste_fraction > 0), None)
        if top is not None:
            top_rule, top_share = top.rule, top.waste_fraction
    return Snapshot(time.time(), breakdown, steps, sampled, a.gpu.busy_fraction, a.gpu.count, top_rule,
                    top_share, time.perf_counter() - t0)


def next_period_s(cost_s: float) -> float:
    return max(MIN_PERIOD_S, COST_FACTOR * cost_s)


class Analyst:
    """Takes a :class:`Snapshot` on its own daemon thread; :attr:`latest` is the last one taken."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.latest: Snapshot | None = None
        self.error: str | None = None  # the last analysis's failure, shown (a half-written folder)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpudoctor-live-analysis", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)  # an analysis under way finishes; a daemon never holds the exit

    def _loop(self) -> None:
        wait = MIN_PERIOD_S
        while not self._stop.wait(wait):
            t0 = time.perf_counter()
            try:
                self.latest, self.error = take(self.folder), None
            except Exception as exc:  # a half-written folder must not end the run; shown, not hidden
                self.error = f"live figures unavailable: {exc}"
            wait = next_period_s(time.perf_counter() - t0)
