"""Cost of one host-sampler tick for a tree of five processes, and its share of the period.

The sampler runs at 10 Hz beside training; a tick should stay well under 5 ms (0.5% of a
core at 10 Hz). A figure of speed, so a bench, not a unit test:

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
        sampler = HostSampler(root.pid, None, tree_refresh_s=3600)
        costs = []
        for _ in range(args.ticks):
            t0 = time.perf_counter()
            sampler.sample()
            costs.append(time.perf_counter() - t0)
        median = statistics.median(costs)
        print(f"processes {len(sampler.pids())}, ticks {len(costs)}: median tick {1000 * median:.2f} ms, "
              f"p90 {1000 * statistics.quantiles(costs, n=10)[8]:.2f} ms; "
              f"cost/period ratio {median / args.interval:.4f} of one core at {1 / args.interval:g} Hz")
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
