"""What timing DDP's all-reduce on the GPU clock costs the host, measured on the CPU.

On a CUDA bucket the hooks do one ``GpuMarks.comm_launch`` (an event record), and once per
backward queue two autograd final callbacks, the second doing ``GpuMarks.comm_end`` (one more
record); the pair is resolved later by ``query()``. No GPU here: the clock is a constant stand-in,
so what is timed is our Python around ``torch.cuda.Event.record()``, not the record itself
(a few µs on a real GPU, unmeasured). Prints the median over blocks and its spread::

    python bench/gpu_comm_marks_cost.py [--calls 20000] [--blocks 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _Clock:
    def record(self) -> object:
        return self

    def query(self, handle: Any) -> bool:
        return True

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return 1.0

    def capturing(self) -> bool:
        return False


def _marks_us(calls: int, buckets: int) -> float:
    """µs per backward: ``buckets`` launches, one end, the resolve (a poll)."""
    from gpudoctor.hooks.device_clock import GpuMarks

    marks = GpuMarks(_Clock(), lambda e: None)
    p0 = time.perf_counter()
    for _ in range(calls):
        for _ in range(buckets):
            marks.comm_launch()
        marks.comm_end()
        marks.poll()
    return 1e6 * (time.perf_counter() - p0) / calls


def _callbacks_us(calls: int, chained: bool) -> float:
    """µs per backward of a one-parameter graph, with or without our two queued final callbacks."""
    import torch

    engine = torch.autograd.Variable._execution_engine
    w = torch.ones(1, requires_grad=True)

    def hook(grad: Any) -> Any:
        if chained:
            engine.queue_callback(functools.partial(engine.queue_callback, lambda: None))
        return grad

    w.register_hook(hook)
    p0 = time.perf_counter()
    for _ in range(calls):
        (w * 2).sum().backward()
    return 1e6 * (time.perf_counter() - p0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--buckets", type=int, default=4)
    args = ap.parse_args()
    marks = [_marks_us(args.calls, args.buckets) for _ in range(args.blocks)]
    bare, chained = [], []
    for _ in range(args.blocks):
        bare.append(_callbacks_us(args.calls // 4, False))
        chained.append(_callbacks_us(args.calls // 4, True))
    extra = [c - b for b, c in zip(bare, chained, strict=True)]
    print(f"GpuMarks, {args.buckets} buckets + end + resolve: {statistics.median(marks):.2f} µs a backward "
          f"(blocks {min(marks):.2f}–{max(marks):.2f})")
    print(f"two queued final callbacks: +{statistics.median(extra):.2f} µs a backward "
          f"(blocks {min(extra):+.2f} to {max(extra):+.2f}; bare backward {statistics.median(bare):.1f} µs)")


if __name__ == "__main__":
    main()
