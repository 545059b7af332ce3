"""Steady state, defined once: the events of training (optimizer steps, batch arrivals) past the
warm-up, and their rate. ``try`` measures steps/s with it, ``sweep`` its windows of arrivals.

The warm-up is what a fix does not change and a long run does not repeat: DataLoader workers
starting, the allocator and caches warming, a compile, the first batches. It ends at whichever
comes last: :data:`MIN_WARMUP` events, :data:`WARMUP_SHARE` of them, and ``after_s`` seconds
after the first (a protocol's fixed warm-up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_WARMUP = 3
WARMUP_SHARE = 0.1
MIN_STEADY = 3  # events past the warm-up needed for a rate


def warmup(events: int) -> int:
    """Events the warm-up takes of ``events`` (the protocol's seconds aside)."""
    return max(MIN_WARMUP, math.ceil(WARMUP_SHARE * events))


def events_for(steady: int) -> int:
    """The fewest events that leave ``steady`` of them past the warm-up (:func:`warmup`'s inverse)."""
    events = steady
    while events - warmup(events) < steady:
        events += 1
    return events


def warm_start(times: Sequence[float], after_s: float = 0.0) -> int | None:
    """Index of the first steady event of ``times`` (sorted), or None without :data:`MIN_STEADY` past it."""
    if not times:
        return None
    first = warmup(len(times))
    if after_s > 0:
        first = max(first, next((i for i, t in enumerate(times) if t >= times[0] + after_s), len(times)))
    return first if len(times) - first >= MIN_STEADY and times[-1] > times[first] else None


def rate(times: Sequence[float], first: int) -> float | None:
    """Events per second from ``times[first]`` to the last."""
    window = times[-1] - times[first] if len(times) > first + 1 else 0.0
    return (len(times) - 1 - first) / window if window > 0 else None
