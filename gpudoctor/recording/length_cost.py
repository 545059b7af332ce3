"""Seconds of a batch at several row widths, timed on the device that ran (``length_cost.json``).

When every recorded batch has one width, the steps hold no second point from which to fit how a
step's time scales with row length; FLOPs alone miss what dominates at small shapes (a CPU's
softmax and masks, a GPU's kernel launches). After the training exits, ``run`` and ``try`` time
the recorded architecture (random weights, forward and backward) at the width that ran and a few
narrower ones, on the same device and threads (:mod:`gpudoctor.launch.length_cost`), and keep
the points here, in the run folder, so ``gpudoctor report`` later reads what was measured then.
On a GPU each point also holds the pass's kernels timed alone (a fourth column): a narrow pass
is bound by its launches, and the padding rule compares the kernels with the training's own.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.recording import validate

FILE = "length_cost.json"
SCHEMA = "gpudoctor.length_cost/1"
MAX_BYTES = 64 * 1024  # a handful of points and a few words: anything larger is not ours
MAX_POINTS = 32


@dataclass(frozen=True)
class LengthPoint:
    """One width timed: ``rows`` rows of ``width`` tokens, forward and backward, ``seconds`` (median);
    on a GPU ``kernel_s``, the same pass's kernels back to back (queued ahead of the GPU: what they
    take beneath the launches), None where not timed."""

    rows: int
    width: int
    seconds: float
    kernel_s: float | None = None

    def row(self) -> list[float]:
        return [self.rows, self.width, self.seconds] + ([self.kernel_s] if self.kernel_s is not None else [])


@dataclass(frozen=True)
class LengthCost:
    """What was timed, where, and how (the words a prediction's basis cites)."""

    points: tuple[LengthPoint, ...]
    device: str  # "cpu", "cuda"
    threads: int | None  # torch intra-op threads, as the training had them
    model: str  # the class timed, e.g. "GPT2LMHeadModel"
    dtype: str | None  # the autocast dtype, when the training used one
    stand_in: bool = False  # a GPT-2 of the recorded shape, for a model of the user's own class
    draws: int = 1  # processes timed, the points their median (gpudoctor.launch.draws)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "device": self.device, "threads": self.threads, "model": self.model,
                           "dtype": self.dtype, "stand_in": self.stand_in, "draws": self.draws,
                           "points": [p.row() for p in self.points]})

    @property
    def kernels(self) -> bool:
        """Every point's kernels were timed alone (a GPU's child)."""
        return all(p.kernel_s is not None for p in self.points)


def write(folder: Path, cost: LengthCost) -> None:
    """``folder``/length_cost.json, atomically and private to the user (0600)."""
    safefs.replace_file(folder / FILE, cost.to_json())


def read(folder: Path) -> LengthCost | None:
    """The folder's measured points; None when absent, unreadable or not ours (never raises)."""
    try:
        owner = os.stat(folder).st_uid
        doc = json.loads(safefs.read_bytes(folder / FILE, owner=owner, limit=MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return parse(doc)


def parse(doc: object) -> LengthCost | None:
    """A parsed ``length_cost.json``, checked field by field (a hand-edited file is refused whole)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    raw = doc.get("points")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_POINTS:
        return None
    points = []
    for item in raw:
        if not (isinstance(item, list) and len(item) in (3, 4) and all(_number(x) for x in item)):
            return None
        rows, width, seconds, *kernel = item
        if rows < 1 or width < 1 or seconds <= 0 or any(k <= 0 for k in kernel):
            return None
        points.append(LengthPoint(int(rows), int(width), float(seconds), float(kernel[0]) if kernel else None))
    threads, dtype = doc.get("threads"), doc.get("dtype")
    return LengthCost(tuple(points), str(doc.get("device") or "cpu")[:16],
                      int(threads) if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1
                      else None,
                      str(doc.get("model") or "the model")[:80], str(dtype)[:32] if isinstance(dtype, str) else None,
                      doc.get("stand_in") is True,
                      validate.draws_of(doc.get("draws")))


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
