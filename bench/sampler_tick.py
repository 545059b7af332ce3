"""Cost of one host-sampler tick for a tree of five processes, and its share of the period.

The sampler runs at 10 Hz beside training on boxes with few cores (once a second when
every core is busy), and refreshes its process tree every second. A tick without a
refresh reads a few ``/proc`` files per tree process; a refresh reads only processes new
since the last one (:mod:`gpudoctor.processes.proctree`), where ``psutil``'s
``children(recursive=True)`` reads every process on the machine. Printed: the median
tick without a refresh, with one (every tick), and that full scan alone, with the ratio
of the last two measured in this run (it grows with the machine's process count). A
figure of speed, so a bench, not a unit test::

    python bench/sampler_tick.py --ticks 300
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import psutil

from gpudoctor.samplers.host import HostSampler

CHILD = "import time; time.sleep(600)"


def median_ms(fn, n: int) -> float:
    costs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        costs.append(time.perf_counter() - t0)
    return 1000 * statistics.median(costs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ticks", type=int, default=300)
    p.add_argument("--interval", type=float, default=0.1, help="the sampler's period (default 0.1 s)")
    args = p.parse_args()
    code = (f"import subprocess, sys, time\nps = [subprocess.Popen([sys.executable, '-c', {CHILD!r}])"
            " for _ in range(4)]\nprint('up', flush=True)\ntime.sleep(600)")
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None and root.stdout.readline().strip() == "up"
        plain = HostSampler(root.pid, None, tree_refresh_s=3600)
        tick = median_ms(plain.sample, args.ticks)
        refreshed = HostSampler(root.pid, None, tree_refresh_s=0)
        with_refresh = median_ms(refreshed.sample, args.ticks)
        proc = psutil.Process(root.pid)
        full_scan = median_ms(lambda: proc.children(recursive=True), args.ticks)
        print(f"processes in the tree {len(plain.pids())}, on the machine {len(psutil.pids())}; "
              f"median of {args.ticks}: tick {tick:.2f} ms, tick with a tree refresh {with_refresh:.2f} ms, "
              f"psutil's full scan alone {full_scan:.2f} ms")
        print(f"tick/period ratio {tick / 1000 / args.interval:.4f} of one core at {1 / args.interval:g} Hz; "
              f"refresh (tick with it minus without) / full scan: {(with_refresh - tick) / full_scan:.3f}")
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
