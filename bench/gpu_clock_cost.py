"""What the GPU clock's marks cost per step, on the fake device clock, as a share of a step.

Per training step with one loader wait the hooks record two events, around the wait; the
wait's end is also the step's reference (``gpudoctor/hooks/device_clock.py``); at the step end
they read back what the GPU passed with ``query()``.
Here :class:`GpuMarks` runs that per-step sequence on ``tests/fake_cuda.FakeClock`` (whose
``record`` is a Python call, not a CUDA one), so the figure is gpudoctor's own bookkeeping per
step; the CUDA part (``cudaEventRecord`` + ``cudaEventQuery``, a few microseconds each) is
not in it: that measurement is pending a GPU (``--cuda`` runs the same loop on
``torch.cuda.Event`` when one is there).

    python bench/gpu_clock_cost.py --steps 20000 --step-ms 10
    python bench/gpu_clock_cost.py --cuda           # on a GPU machine

Prints the cost per step in microseconds (median of 5 repeats, and their spread; on the fake the
same loop without marks is subtracted, so the fake GPU's own simulation is not counted) and
its ratio to a ``--step-ms`` step; the budget is 1%.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpudoctor.hooks.device_clock import CudaClock, DeviceClock, GpuMarks  # noqa: E402
from tests.fake_cuda import FakeClock, FakeGpu  # noqa: E402


class _NoMarks:
    """The same calls doing nothing: the loop's and the fake GPU's own cost, subtracted."""

    def wait_start(self) -> None: ...
    def wait_end(self) -> None: ...
    def step_end(self, n: int) -> None: ...


def per_step_us(clock: DeviceClock | None, steps: int, advance: FakeGpu | None) -> float:
    out: list[dict[str, object]] = []
    marks: GpuMarks | _NoMarks = GpuMarks(clock, out.append) if clock is not None else _NoMarks()
    t0 = time.perf_counter()
    for n in range(1, steps + 1):
        marks.wait_start()
        if advance is not None:
            advance.host(0.001)
        marks.wait_end()
        if advance is not None:
            advance.launch(0.005, launch_s=0.004)
        marks.step_end(n)
    return 1e6 * (time.perf_counter() - t0) / steps


def _records_per_step(steps: int = 100) -> float:
    gpu = FakeGpu()
    clock = FakeClock(gpu)
    per_step_us(clock, steps, gpu)
    return clock.records / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--step-ms", type=float, default=10.0, help="the step the cost is a share of (default 10 ms)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cuda", action="store_true", help="torch.cuda.Event instead of the fake")
    args = p.parse_args(argv)
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print("gpu_clock_cost: --cuda needs a GPU", file=sys.stderr)
            return 2
        runs = [per_step_us(CudaClock(torch), args.steps, None) for _ in range(args.repeats)]
        label = "torch.cuda.Event"
    else:
        runs = []
        for _ in range(args.repeats):
            gpu = FakeGpu()
            marked = per_step_us(FakeClock(gpu), args.steps, gpu)
            gpu = FakeGpu()
            runs.append(marked - per_step_us(None, args.steps, gpu))
        label = "fake clock (Python bookkeeping only; CUDA record/query cost pending a GPU)"
    records = _records_per_step()
    med = statistics.median(runs)
    print(f"clock: {label}")
    print(f"per step ({records} records + read back): {med:.2f} us median of {len(runs)} "
          f"(min {min(runs):.2f}, max {max(runs):.2f})")
    print(f"ratio to a {args.step_ms:g} ms step: {med / (1000 * args.step_ms):.5f} (budget 0.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
