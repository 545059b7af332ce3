"""Ray's per-trial overhead for ``gpudoctor sweep --backend ray`` (docs/scale.md).

A trial is the same work on either backend (:func:`gpudoctor.sweep.trial.run_trial`); what Ray
adds is starting (or joining) the instance once per sweep, and per trial: scheduling the task,
a worker process to run it (started cold the first time, reused after), importing the sweep's
task module in that worker, and shipping the result back. This measures each on a local
instance started like the sweep's own (``ray.init`` with this machine's cores and a 100 MiB
object store), with a task that returns a trial-sized result (a few kB) and does no work::

    python bench/ray_overhead.py --tasks 30

Prints seconds; the ratio line compares the per-trial cost with a trial of ``--trial-s``
seconds (the sweep's default measuring window is tens of seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def _payload(size: int) -> dict[str, Any]:
    return {"run": {"status": "ok", "reason": ""}, "measure": {"x": "y" * size}, "log": ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=30, help="warm tasks timed (default 30)")
    p.add_argument("--result-bytes", type=int, default=16_000, help="result size (default 16 kB: a log tail)")
    p.add_argument("--trial-s", type=float, default=30.0, help="a trial's own length, for the ratio")
    args = p.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # ray.init saves an auth token in ~/.ray, which then turns token auth on for every later head
    # started on this machine: a throwaway home keeps the bench from changing the user's Ray.
    os.environ["HOME"] = tempfile.mkdtemp(prefix="gpudoctor-ray-bench-")
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=100 * 2**20, include_dashboard=False,
             log_to_driver=False)
    init_s = time.perf_counter() - t0

    @ray.remote(num_cpus=1)
    def empty(size: int) -> dict[str, Any]:
        return _payload(size)

    @ray.remote(num_cpus=1)
    def with_module(size: int) -> dict[str, Any]:
        import gpudoctor.sweep.ray_backend  # noqa: F401 - what a trial task imports first

        return _payload(size)

    t0 = time.perf_counter()
    ray.get(empty.remote(args.result_bytes))
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ray.get(with_module.remote(args.result_bytes))
    module_s = time.perf_counter() - t0
    warm = []
    for _ in range(args.tasks):
        t0 = time.perf_counter()
        ray.get(empty.remote(args.result_bytes))
        warm.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ray.shutdown()
    shutdown_s = time.perf_counter() - t0
    warm_s = statistics.median(warm)
    print(f"ray {ray.__version__}, {os.cpu_count()} cores")
    print(f"once per sweep: ray.init {init_s:.2f} s, shutdown {shutdown_s:.2f} s")
    print(f"first task (cold worker process): {cold_s:.3f} s")
    print(f"a task importing gpudoctor.sweep.ray_backend (first time in a worker): {module_s:.3f} s")
    print(f"warm task round trip, median of {args.tasks}: {warm_s * 1000:.1f} ms "
          f"(p90 {sorted(warm)[int(0.9 * len(warm)) - 1] * 1000:.1f} ms)")
    worst = cold_s + module_s
    print(f"per-trial overhead / a {args.trial_s:.0f} s trial: warm {warm_s / args.trial_s:.5f}, "
          f"cold worker {worst / args.trial_s:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
