"""Wall-clock steps during a recording, found and taken out on load.

Every recorded time is ``time.time()``, so the processes of a run line up. When the system's
wall clock is stepped while it records (a virtual machine resumed from a pause, a large NTP or
chrony correction, someone's ``date -s``), every time written after the step sits that many
seconds later: a 10.7 s training once read as 33.2 s of wall with 80% of it startup, on a VM whose
clock stepped 18 s forward. The doctor's samplers write the monotonic clock (``m``, system-wide
on Linux, never stepped) beside each row's ``t``; between two rows the wall clock moved
``t2 - t1`` where ``m2 - m1`` passed: the difference is a step.

A forward step of ``d`` between rows 1 and 2 splits every raw time cleanly: anything written
before it is earlier than ``t1 + (m2 - m1)``, anything after it later than ``t1 + d``. Where
``d`` exceeds ``m2 - m1`` those ranges do not meet, and a raw time past the first is moved back by
``d`` (steps add up). A step no longer than the rows' gap, or backwards (times written after it
overlap those before), cannot be told apart by value: it is said, not undone. A time computed
from an older moment but written after the step (a process's start read late) can stay on the
wrong side; the hooks' spans carry their start as read when they began, and durations come from
``perf_counter``, which a step does not move.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_STEP_S = 1.0  # under this, a step is within what the rows' own timing spreads (a late tick)
MAX_NOTES = 5  # a folder may come from anyone: a forged file of steps says a few, then how many more
MAX_MONOTONIC_S = 1e10  # a monotonic reading is seconds since boot: past this it is not one


@dataclass(frozen=True)
class ClockSteps:
    """The forward steps of one recording's wall clock: ``after[i]`` is the raw time past which
    ``shift[i]`` seconds (this step and those before it) are taken off."""

    after: tuple[float, ...] = ()
    shift: tuple[float, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __bool__(self) -> bool:
        return bool(self.after)

    def fix(self, t: float) -> float:
        """``t`` on the recording's unstepped clock."""
        i = bisect.bisect_left(self.after, t)
        return t - self.shift[i - 1] if i else t

    def fix_rows(self, rows: list[dict[str, Any]], keys: Sequence[str] = ("t",)) -> None:
        """Each row's times at ``keys`` (numbers), in place."""
        for row in rows:
            for key in keys:
                v = row.get(key)
                if type(v) is float or type(v) is int:
                    row[key] = self.fix(float(v))


def from_rows(rows: Sequence[dict[str, Any]]) -> ClockSteps:
    """The steps the doctor's sample rows show (rows with both ``t`` and ``m``, in file order)."""
    after: list[float] = []
    shift: list[float] = []
    notes: list[str] = []
    total = 0.0
    prev: tuple[float, float] | None = None
    timed = sorted(((row["t"], row["m"]) for row in rows if _number(row.get("t")) and _number(row.get("m"))
                    and 0 <= row["m"] < MAX_MONOTONIC_S), key=lambda tm: tm[1])  # in the order they were taken (a step back reorders them by wall time)
    for t, m in timed:
        if prev is not None:
            dm = m - prev[1]
            d = (t - prev[0]) - dm
            if d >= MIN_STEP_S and d > dm:
                after.append(prev[0] + dm)  # raw times: before the step, all under this
                total += d
                shift.append(total)
                notes.append(f"The wall clock was stepped {d:.1f} s forward at {_clock(prev[0] + dm - total + d)} "
                             "(a virtual machine resumed, or a clock correction); the times recorded after it are "
                             "taken back by that much (the doctor's monotonic clock).")
            elif abs(d) >= MIN_STEP_S:
                way = "forward" if d > 0 else "back"
                notes.append(f"The wall clock was stepped {abs(d):.1f} s {way} at {_clock(prev[0] + dm - total)}; the "
                             "times recorded around it cannot be told apart, so they stand as recorded: durations "
                             "across it are off by that much.")
        prev = (t, m)
    if len(notes) > MAX_NOTES:
        notes[MAX_NOTES:] = [f"... and {len(notes) - MAX_NOTES} more wall-clock steps."]
    return ClockSteps(tuple(after), tuple(shift), tuple(notes))


def _number(v: object) -> bool:
    return (type(v) is float or type(v) is int) and v == v  # not NaN


def _clock(t: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, ValueError, OSError):  # a forged time: said, never raised
        return "an unreadable time"
