"""Interval arithmetic for turning overlapping spans into disjoint time slices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals, sorted and non-overlapping."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def subtract(intervals: Sequence[Interval], minus: Sequence[Interval]) -> list[Interval]:
    """``intervals`` minus ``minus``; both must be merged (sorted, disjoint)."""
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


def total(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def assign_by_priority(
    categories: Sequence[tuple[str, Iterable[Interval]]], lo: float, hi: float
) -> dict[str, list[Interval]]:
    """Give each moment in [lo, hi] to the first category (in order) active then.

    This is what keeps the breakdown disjoint: a DataLoader wait inside an
    evaluation counts as eval, a torch.save inside a step as checkpoint.
    """
    taken: list[Interval] = []
    result: dict[str, list[Interval]] = {}
    for name, spans in categories:
        mine = subtract(merge(clip(spans, lo, hi)), taken)
        result[name] = mine
        taken = merge([*taken, *mine])
    return result
