"""When a process started, on the clock of ``time.time()``, to a clock tick (~10 ms).

psutil's ``create_time()`` adds the process's start tick to ``/proc/stat``'s boot time, which
is whole seconds: on Linux it reads up to a second early, by the same fraction for every
process of a host (0.95 s on one of ours). Beside ``time.time()`` that is startup that never
happened, a child born after the watch began taken for one born before it, or two trainings in
a row read as running together. This reads the start tick against ``CLOCK_BOOTTIME`` instead.
Stdlib only: the hooks write it from inside the patient.
"""

from __future__ import annotations

import os
import time


def started_at(pid: int) -> float | None:
    """Epoch start of ``pid`` to a clock tick; None where ``/proc`` does not tell (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # after the name, which may hold spaces
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age_s
