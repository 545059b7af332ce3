"""Interval arithmetic for turning overlapping spans into disjoint time slices."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import islice, starmap
from operator import itemgetter, lt, sub

Interval = tuple[float, float]

# A day at one step per 0.5 s is ~170k data-wait spans: these loops are the
# report's hot path, hence the unrolled min/max and no per-item function calls.


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals, sorted and non-overlapping."""
    items = sorted(intervals)
    if _disjoint(items):
        return items
    out: list[Interval] = []
    append = out.append
    start = end = -math.inf
    for a, b in items:
        if b <= a:
            continue
        if a <= end:
            if b > end:
                end = b
        else:
            if end > start:
                append((start, end))
            start, end = a, b
    if end > start:
        append((start, end))
    return out


def _disjoint(items: list[Interval]) -> bool:
    """Sorted items already non-empty and apart (the usual case for batch waits), at C speed."""
    starts = list(map(itemgetter(0), items))
    ends = list(map(itemgetter(1), items))
    return all(map(lt, starts, ends)) and all(map(lt, ends, islice(starts, 1, None)))


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    if hi <= lo:
        return []
    return [(a if a > lo else lo, b if b < hi else hi) for a, b in intervals if a < b and b > lo and a < hi]


def subtract(intervals: Sequence[Interval], minus: Sequence[Interval]) -> list[Interval]:
    """``intervals`` minus ``minus``; both must be merged (sorted, disjoint)."""
    if not minus or not intervals:
        return list(intervals)
    if 8 * len(minus) < len(intervals):
        return _keep_gaps(intervals, minus)
    out: list[Interval] = []
    j = 0
    for start, end in intervals:
        cur = start
        while j < len(minus) and minus[j][1] <= cur:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] < end:
            if minus[k][0] > cur:
                out.append((cur, minus[k][0]))
            cur = max(cur, minus[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def _keep_gaps(intervals: Sequence[Interval], minus: Sequence[Interval]) -> list[Interval]:
    """:func:`subtract` for a few holes in many intervals: slice out the runs between holes."""
    starts = list(map(itemgetter(0), intervals))
    ends = list(map(itemgetter(1), intervals))
    bounds = [-math.inf, *(x for m in minus for x in m), math.inf]
    out: list[Interval] = []
    for lo, hi in zip(bounds[::2], bounds[1::2], strict=True):  # the gaps between holes
        j, k = bisect_right(ends, lo), bisect_left(starts, hi)
        if j >= k:
            continue
        run = list(intervals[j:k])
        run[0] = (max(run[0][0], lo), run[0][1])
        run[-1] = (run[-1][0], min(run[-1][1], hi))
        out.extend(run)
    return out


def total(intervals: Iterable[Interval]) -> float:
    return float(-sum(starmap(sub, intervals)))  # sum of (end - start), at C speed


def total_after(intervals: Sequence[Interval], t: float) -> float:
    """Seconds of sorted, disjoint ``intervals`` after ``t`` (walks back from the end only)."""
    seconds = 0.0
    for a, b in reversed(intervals):
        if b <= t:
            break
        seconds += b - max(a, t)
    return seconds


def assign_by_priority(
    categories: Sequence[tuple[str, Iterable[Interval]]], lo: float, hi: float
) -> dict[str, list[Interval]]:
    """Give each moment in [lo, hi] to the first category (in order) active then.

    This is what keeps the breakdown disjoint: a DataLoader wait inside an
    evaluation counts as eval, a torch.save inside a step as checkpoint.
    """
    taken: list[Interval] = []
    result: dict[str, list[Interval]] = {}
    for i, (name, spans) in enumerate(categories):
        mine = subtract(merge(clip(spans, lo, hi)), taken)
        result[name] = mine
        if i < len(categories) - 1:
            taken = merge([*taken, *mine])
    return result
