"""How long the doctor gives the patient for each step of an attach, scaled by how busy the machine is.

A shared training node is busy by nature. Every step of the injection runs on a CPU it must wait
for: gdb or the patient's interpreter starting, the patient's main thread reaching a bytecode
boundary and running the payload, its watchdog confirming the detach. A budget fixed for a quiet
machine runs out on a loaded one (issue #38: at load 4.7 on 2 cores the hooks never went in).

So each budget is a base figure times a factor read from the machine just before the step, without
stopping anything:

* the load average per core (``/proc/loadavg``): a runnable process gets about 1/L of a core;
* the patient's main thread's wait for a core (``/proc/PID/task/PID/schedstat``: its CPU time and
  its time runnable with no core, sampled twice): a thread that waits a share ``w`` of the time it
  wants a core progresses ``1/(1-w)`` times slower than alone; the main thread is the one that runs
  the injected code. Both figures are counted when the thread is switched, so their ratio holds over
  a short look where either alone, over the wall time, does not.

The larger of the two, capped at :data:`MAX_FACTOR`: a machine that slow is better told the hooks
did not go in than made to wait minutes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MAX_FACTOR = 6.0
SAMPLE_S = 0.25  # between the two looks at the patient's schedstat
INJECT_BASE_S = 20.0  # gdb's run, or the patient's interpreter calling sys.remote_exec, on a quiet machine
DETACH_BASE_S = 5.0  # the patient confirming its hooks are out
MAX_TRIES = 3  # injections that ran out of time (nothing was queued) are tried again, each with a fresh budget


@dataclass(frozen=True)
class Budget:
    """The factor, and what it was read from (meta.json keeps both; the report words them)."""

    factor: float
    load_per_core: float | None
    run_delay_share: float | None  # of the time the patient's main thread wanted a core, spent waiting for one

    def seconds(self, base_s: float) -> float:
        return round(base_s * self.factor, 1)


def measure(pid: int, sample_s: float = SAMPLE_S) -> Budget:
    """The machine's business as ``pid`` sees it now (takes ``sample_s``); never fails, at worst unscaled."""
    load = _load_per_core()
    first = _schedstat_ns(pid)
    time.sleep(sample_s)
    second = _schedstat_ns(pid)
    share = None
    if first is not None and second is not None:
        ran_ns, waited_ns = second[0] - first[0], second[1] - first[1]
        if ran_ns + waited_ns > 0:  # else it slept throughout: nothing to say
            share = round(min(0.95, max(0.0, waited_ns / (ran_ns + waited_ns))), 2)
    slowdowns = [1.0, load or 0.0, 1.0 / (1.0 - share) if share is not None else 0.0]
    return Budget(round(min(MAX_FACTOR, max(slowdowns)), 2), load, share)


def _load_per_core() -> float | None:
    try:
        return round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)
    except OSError:
        return None


def _schedstat_ns(pid: int) -> tuple[int, int] | None:
    """(on a core, runnable with no core): nanoseconds of the main thread of ``pid`` since it started."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", encoding="ascii") as fh:
            fields = fh.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):  # gone, not Linux, or schedstats off: load alone says
        return None
