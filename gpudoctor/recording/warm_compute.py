"""A step's compute back to back and after a batch build, timed on the device that ran (``warm_compute.json``).

A loop that builds each batch on the training process runs its compute between two long builds;
that compute is slower than the same compute back to back (the build's code and data push the
step's out of the caches, a core that idled wakes slowly). A fix that takes the build out of the loop (a
cache, pre-tokenizing) leaves the compute back to back, which the recording never saw. After the
training exits, ``run`` and ``try`` time a stand-in step of the recorded compute's length both ways
on the same threads (:mod:`gpudoctor.launch.warm_compute`) and keep the two figures here, so
``gpudoctor report`` later reads what was measured then.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.recording import validate

FILE = "warm_compute.json"
SCHEMA = "gpudoctor.warm_compute/1"
MAX_BYTES = 16 * 1024
MAX_WORKER_RATIO = 20.0  # the compute beside a worker over as measured, at most (and at least its inverse)
MAX_BESIDE = 16  # busy processes a timing runs beside its stand-in, at most (the timing's cap, the reader's check)


@dataclass(frozen=True)
class WarmCompute:
    """A stand-in step timed back to back (``warm_s``) and after ``gap_s`` of build-like work (``cold_s``)."""

    warm_s: float
    cold_s: float
    gap_s: float
    gap: str  # "cpu": the gap computed in Python, "wait": it slept
    threads: int | None
    stand_in: str  # what was timed, in words
    beside: int = 0  # busy processes beside the step after the gap (the workers' busy cores)
    worker_s: float | None = None  # a step back to back beside a process burning ``worker_cpu_s`` each step
    worker_cpu_s: float | None = None  # the build's CPU a background worker would burn per batch
    draws: int = 1  # processes timed, the figures their median (gpudoctor.launch.draws)

    @property
    def with_workers(self) -> float | None:
        """The compute once background workers build the batches over the compute as measured (a
        worker's CPU taken from the compute's cores can make it slower than measured); None: not timed."""
        if self.worker_s is None or self.cold_s <= 0:
            return None
        return min(MAX_WORKER_RATIO, max(1.0 / MAX_WORKER_RATIO, self.worker_s / self.cold_s))

    @property
    def ratio(self) -> float:
        """Back-to-back compute over compute after a build (at most 1: a gap never makes a step faster)."""
        return min(1.0, self.warm_s / self.cold_s) if self.cold_s > 0 else 1.0

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "warm_s": self.warm_s, "cold_s": self.cold_s, "gap_s": self.gap_s,
                           "gap": self.gap, "threads": self.threads, "stand_in": self.stand_in,
                           "beside": self.beside, "draws": self.draws,
                           **({"worker_s": self.worker_s, "worker_cpu_s": self.worker_cpu_s}
                              if self.worker_s is not None else {})})


def write(folder: Path, warm: WarmCompute) -> None:
    """``folder``/warm_compute.json, atomically and private to the user (0600)."""
    safefs.replace_file(folder / FILE, warm.to_json())


def read(folder: Path) -> WarmCompute | None:
    """The folder's timing; None when absent, unreadable or not ours (never raises)."""
    try:
        owner = os.stat(folder).st_uid
        doc = json.loads(safefs.read_bytes(folder / FILE, owner=owner, limit=MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return parse(doc)


def parse(doc: object) -> WarmCompute | None:
    """A parsed ``warm_compute.json``, checked field by field (a hand-edited file is refused whole)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    warm, cold, gap = doc.get("warm_s"), doc.get("cold_s"), doc.get("gap_s")
    if not all(positive(x) for x in (warm, cold, gap)):
        return None
    assert isinstance(warm, (int, float)) and isinstance(cold, (int, float)) and isinstance(gap, (int, float))
    threads, beside = doc.get("threads"), doc.get("beside")
    worker, worker_cpu = doc.get("worker_s"), doc.get("worker_cpu_s")
    both = (float(worker), float(worker_cpu)) if (positive(worker) and positive(worker_cpu) and isinstance(
        worker, (int, float)) and isinstance(worker_cpu, (int, float))) else (None, None)
    return WarmCompute(float(warm), float(cold), float(gap), "wait" if doc.get("gap") == "wait" else "cpu",
                       int(threads) if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1
                       else None, str(doc.get("stand_in") or "a stand-in step")[:120],
                       int(beside) if isinstance(beside, int) and not isinstance(beside, bool) and 0 <= beside <= MAX_BESIDE else 0,
                       worker_s=both[0], worker_cpu_s=both[1], draws=validate.draws_of(doc.get("draws")))


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
