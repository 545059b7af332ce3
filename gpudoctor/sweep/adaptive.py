"""``--adaptive``: coordinate ascent, one axis at a time, instead of the whole grid.

From the user's current setting (or the grid point nearest to it), try every
value of one axis with the others held, move to the fastest, go on to the next
axis, and stop after a pass that moved nothing. Throughput surfaces over workers,
micro-batch and accumulation are close to separable, so this usually lands on
the grid's winner in a sum of the axis lengths instead of their product. Axes
tied by ``--hold-global-batch`` move together as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.sweep.axes import ACCUM, BATCH, GPUS
from gpudoctor.sweep.plan import Point

MAX_PASSES = 3


@dataclass
class Ascent:
    best: Point | None
    visited: list[int] = field(default_factory=list)
    passes: int = 0


def groups(keys: Sequence[str], hold: bool) -> list[list[str]]:
    """Axes that move together: the batch keys as one under ``--hold-global-batch``."""
    if not hold:
        return [[k] for k in keys]
    tied = [k for k in keys if k in (BATCH, ACCUM, GPUS)]
    return [tied] + [[k] for k in keys if k not in tied]


def start_point(points: list[Point], baseline: dict[str, Any], grid_size: int) -> Point | None:
    """The current setting if the grid has it, else the runnable point sharing most of its values."""
    runnable = [p for p in points[:grid_size] if not p.skip]
    if not runnable:
        return None
    return max(
        runnable, key=lambda p: (sum(p.params.get(k) == v for k, v in baseline.items()), -p.index)
    )


def climb(
    points: list[Point],
    axis_groups: list[list[str]],
    start: Point,
    score: Callable[[Point], float | None],
) -> Ascent:
    """Coordinate ascent over the grid ``points`` from ``start``; ``score`` runs (or recalls) a trial."""
    runnable = [p for p in points if not p.skip]
    result = Ascent(start)
    seen: dict[int, float | None] = {}

    def value(p: Point) -> float | None:
        if p.index not in seen:
            seen[p.index] = score(p)
            result.visited.append(p.index)
        return seen[p.index]

    current = start
    for result.passes in range(1, MAX_PASSES + 1):
        moved = False
        for group in axis_groups:
            line = [
                p
                for p in runnable
                if all(p.params.get(k) == current.params.get(k) for k in p.params if k not in group)
            ]
            scored = [(v, -p.index, p) for p in line if (v := value(p)) is not None]
            if not scored:
                continue
            top = max(scored, key=lambda s: (s[0], s[1]))[2]
            here = value(current)
            if top is not current and (here is None or (seen[top.index] or 0.0) > here):
                current, moved = top, True
        if not moved:
            break
    result.best = current if value(current) is not None else None
    return result
