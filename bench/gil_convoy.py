"""How late a sleeping thread wakes beside a main thread that lets go of the GIL briefly and often.

The attach payload's watchdog sleeps a second, then needs the GIL to read the doctor's detach flag.
A main thread that calls a GIL-releasing function for a few microseconds about every millisecond
(here ``select`` with a zero timeout) re-takes the GIL before the woken thread is scheduled, and the
waiter never forces a switch because the GIL changed hands in its 5 ms wait (CPython's convoy): on a
quiet machine the wake came 1-12 s late, and the doctor reported the detach unconfirmed. The same
loop looking by the clock (a few times a second), or never, wakes its thread within milliseconds.
Small torch ops on the main thread do not do this (checked by hand, 0 ms late). On a busy machine
the effect fades: the main thread is descheduled and the waiter gets in.

    python bench/gil_convoy.py

Each case runs in its own interpreter, one after another; prints the median lateness per case and
the ratio of the convoy's to the clock's.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CHILD = r"""
import select, sys, threading, time
mode = sys.argv[1]
late = []
def watch():
    while len(late) < 5:
        t = time.perf_counter(); time.sleep(0.5); late.append(time.perf_counter() - t - 0.5)
th = threading.Thread(target=watch, daemon=True); th.start()
n, look = 0, time.time()
while th.is_alive():
    n += sum(range(100)) == 4950
    if mode == "every-1000-rounds" and n % 1000 == 0:
        select.select([sys.stdin], [], [], 0)
    elif mode == "by-the-clock" and time.time() - look > 0.25:
        look = time.time(); select.select([sys.stdin], [], [], 0)
print(" ".join(str(x) for x in late))
"""

MODES = ("never", "by-the-clock", "every-1000-rounds")


def lateness(mode: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=300, check=True)
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    medians: dict[str, float] = {}
    for mode in MODES:
        late = lateness(mode)
        medians[mode] = statistics.median(late)
        print(f"{mode:>18}: a 0.5 s sleep woke late by {', '.join(f'{1000 * x:.0f}' for x in late)} ms "
              f"(median {1000 * medians[mode]:.0f} ms)")
    ratio = medians["every-1000-rounds"] / max(medians["by-the-clock"], 1e-4)
    print(f"convoy / by the clock: {ratio:.0f}x later")


if __name__ == "__main__":
    main()
