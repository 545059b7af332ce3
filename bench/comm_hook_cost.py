"""What timing the collectives costs: microseconds per collective with and without the wrapper.

Runs itself as a 2-rank gloo job on the CPU (``python -m torch.distributed.run``) and, in each
rank, alternates blocks of:

* a direct ``torch.distributed.all_reduce`` of a 1-element tensor, bare and through the
  wrapper the hooks put on ``torch.distributed`` (:meth:`CommHooks._wrap_direct`);
* a DDP backward over a small model (a few gradient buckets), with DDP's default all-reduce
  hook registered bare and with the same hook inside the timing wrapper (:meth:`CommHooks.timed`).

Prints, per rank, the median over blocks of µs per call for each, and the wrapper's added µs per
collective (per bucket for DDP). The machine is shared and the all-reduce itself varies by tens of
µs: read the medians and their spread, not one block::

    python bench/comm_hook_cost.py [--calls 2000] [--blocks 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _direct_us(calls: int, wrapped: bool) -> float:
    import torch
    import torch.distributed as dist

    from gpudoctor.hooks.comm_hooks import CommHooks
    from gpudoctor.hooks.writer import EventWriter

    fn = dist.all_reduce
    if wrapped:
        hooks = CommHooks(EventWriter(Path(tempfile.mkdtemp(prefix="gd-cost-"))))
        fn = hooks._wrap_direct(dist.all_reduce)
    x = torch.ones(1)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - t) / calls * 1e6


def _ddp_us(steps: int, wrapped: bool) -> tuple[float, int]:
    """µs per backward (and buckets per backward) with the default all-reduce hook, bare or timed."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpudoctor.hooks.comm_hooks import CommHooks
    from gpudoctor.hooks.writer import EventWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8)))
    ddp = DDP(model, bucket_cap_mb=0.02)  # ~5 buckets of 2 layers
    hooks = CommHooks(EventWriter(Path(tempfile.mkdtemp(prefix="gd-cost-"))))
    ddp.register_comm_hook(ddp.process_group, hooks.timed(allreduce_hook) if wrapped else allreduce_hook)
    x = torch.randn(4, 64)
    for _ in range(3):  # DDP rebuilds its buckets after the first backward
        ddp(x).sum().backward()
    hooks.round.buckets.clear()
    t = time.perf_counter()
    buckets = 0
    for _ in range(steps):
        ddp(x).sum().backward()
        buckets += len(hooks.round.buckets)
        hooks.round.buckets.clear()
    return (time.perf_counter() - t) / steps * 1e6, buckets // steps if wrapped else 0


def _own_us(calls: int) -> tuple[float, float]:
    """The wrappers' own cost, without the network's noise: µs per call added around a collective
    that returns at once (a direct call on a CPU tensor) and around a DDP hook whose future is done."""
    import torch

    from gpudoctor.hooks.comm_hooks import CommHooks
    from gpudoctor.hooks.writer import EventWriter

    hooks = CommHooks(EventWriter(Path(tempfile.mkdtemp(prefix="gd-cost-"))))

    def all_reduce(tensor: Any, group: Any = None, async_op: bool = False) -> None:
        return None

    def hook(state: object, bucket: Any) -> Any:
        fut: Any = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    class Bucket:
        def __init__(self) -> None:
            self._buf = torch.zeros(1024)

        def buffer(self) -> Any:
            return self._buf

    x, bucket = torch.ones(1), Bucket()
    out = []
    for bare, wrapped, arg in ((all_reduce, hooks._wrap_direct(all_reduce), (x,)),
                               (hook, hooks.timed(hook), (None, bucket))):
        times = {}
        for name, fn in (("bare", bare), ("wrapped", wrapped)):
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(calls):
                    fn(*arg)
                best = min(best, (time.perf_counter() - t) / calls * 1e6)
            times[name] = best
            hooks.round.buckets.clear()
        out.append(times["wrapped"] - times["bare"])
    return out[0], out[1]


def rank_main(calls: int, blocks: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    own_direct, own_hook = _own_us(calls * 5)
    print(f"rank {rank}: the wrappers' own cost (best of 5 x {calls * 5} calls, nothing on the wire): "
          f"+{own_direct:.2f} µs a direct call, +{own_hook:.2f} µs a DDP bucket", flush=True)
    direct: dict[bool, list[float]] = {False: [], True: []}
    ddp: dict[bool, list[float]] = {False: [], True: []}
    buckets = 0
    for i in range(blocks):
        for wrapped in ((False, True) if i % 2 == 0 else (True, False)):
            direct[wrapped].append(_direct_us(calls, wrapped))
            us, n = _ddp_us(max(20, calls // 20), wrapped)
            ddp[wrapped].append(us)
            buckets = max(buckets, n)
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in direct.items()}
    dmed = {k: statistics.median(v) for k, v in ddp.items()}
    added = [w - b for b, w in zip(direct[False], direct[True], strict=True)]
    added_ddp = [(w - b) / max(1, buckets) for b, w in zip(ddp[False], ddp[True], strict=True)]
    print(f"rank {rank}: all_reduce(1 float) {med[False]:.1f} µs bare, {med[True]:.1f} µs wrapped: "
          f"{statistics.median(added):+.2f} µs a call (blocks {min(added):+.2f}..{max(added):+.2f}), "
          f"ratio {med[True] / med[False]:.3f}", flush=True)
    print(f"rank {rank}: DDP backward ({buckets} buckets) {dmed[False]:.0f} µs with allreduce_hook, "
          f"{dmed[True]:.0f} µs timed: {statistics.median(added_ddp):+.2f} µs a bucket "
          f"(blocks {min(added_ddp):+.2f}..{max(added_ddp):+.2f}), ratio {dmed[True] / dmed[False]:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="all_reduce calls per block (default 2000)")
    ap.add_argument("--blocks", type=int, default=7, help="blocks per variant, alternating (default 7)")
    args = ap.parse_args(argv)
    if "RANK" in os.environ:
        rank_main(args.calls, args.blocks)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__,
           "--calls", str(args.calls), "--blocks", str(args.blocks)]
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
