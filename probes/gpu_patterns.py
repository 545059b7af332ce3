"""Plant one of issue #25's GPU patterns on CUDA and time it on the GPU's own clock.

    gpudoctor run --out runs/trap -- python probes/gpu_patterns.py --pattern trap --truth runs/trap.truth.json
    gpudoctor run --out runs/sync -- python probes/gpu_patterns.py --pattern sync --truth runs/sync.truth.json
    gpudoctor run --out runs/stall -- python probes/gpu_patterns.py --pattern stall --truth runs/stall.truth.json
    gpudoctor run --out runs/save -- python probes/gpu_patterns.py --pattern save --truth runs/save.truth.json

``trap``: ``for batch in loader: batch.to("cuda"); loss = model(batch); loss.backward(); opt.step()``
with a batch built on the main process (``--build-ms``, 60) and a GPU step of about ``--gpu-ms``
(100): the pageable copy waits for the previous step, so the host "waits for data" while the
GPU is busy. Expected: no ``data_stall``; workers predicted at most 1.1x.
``sync``: workers keep batches ready; ``loss.item()`` after forward, then ``--python-ms`` (30) of
host work before backward. Expected: ``host_sync``.
``stall``: a GPU step of about ``--build-ms`` / 2 behind the 60 ms main-process build: the GPU
idles in the waits. Expected: ``data_stall`` with workers.
``save``: workers keep batches ready; every ``--save-every`` (10) steps ``torch.save`` of the
model's ``state_dict()`` (CUDA tensors: the save waits for the queued step, copies, then writes).
Expected: ``checkpoint_overhead``, its seconds per save those of the GPU (``gpu_save_ms_p50``).

Like every probe, this never imports gpudoctor. Its ground truth is measured with
``torch.cuda.Event`` inside the probe (events at each step end, around each loader wait,
around the copy, and between a sync's return and the next launch) and read back after the
loop, so the truth costs the loop nothing: it is written as JSON to ``--truth`` (or
``$GPUDOCTOR_PROBE_TRUTH``). Needs CUDA: without it, one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pattern", choices=("trap", "sync", "stall", "save"), required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--gpu-ms", type=float, default=100.0, help="target GPU step (trap, sync); stall: build-ms / 2")
    p.add_argument("--build-ms", type=float, default=60.0, help="main-process batch build (trap, stall)")
    p.add_argument("--python-ms", type=float, default=30.0, help="host work after the sync (sync)")
    p.add_argument("--save-every", type=int, default=10, help="steps between checkpoint saves (save)")
    p.add_argument("--save-dir", default=None, help="where the saves go (save; default: a temporary folder)")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--truth", default=os.environ.get("GPUDOCTOR_PROBE_TRUTH"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch
    from torch.utils.data import DataLoader, Dataset

    if not torch.cuda.is_available():
        print("gpu_patterns: CUDA is not available; run this probe on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda")
    width, rows = args.width, 4096
    target_ms = args.build_ms / 2 if args.pattern == "stall" else args.gpu_ms
    layers = _layers_for(torch, dev, width, rows, target_ms)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    build_s = args.build_ms / 1000 if args.pattern in ("trap", "stall") else 0.0

    class Batches(Dataset):  # type: ignore[type-arg]
        """Each batch costs ``build_s`` of CPU and nothing else: one tensor made once (a fresh
        ``randn`` of 4096 x 4096 took 173 ms on one thread of an H200 host, three times the build
        asked for), returned again each time, a pageable 64 MB copy for the loop's ``.to()``."""

        def __init__(self) -> None:
            self.batch = torch.randn(rows, width)

        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> Any:
            end = time.perf_counter() + build_s  # the batch build: CPU work on whoever builds it
            while time.perf_counter() < end:
                pass
            return self.batch

    workers = 2 if args.pattern in ("sync", "save") else 0
    save_dir = args.save_dir or tempfile.mkdtemp(prefix="gpu_patterns-save-")
    saves: list[tuple[Any, Any]] = []
    loader = DataLoader(Batches(), batch_size=None, num_workers=workers)
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    marks: list[dict[str, Any]] = []
    it = iter(loader)
    prev_end = None
    host_wait_s = 0.0
    t_start = time.perf_counter()
    for _ in range(args.steps):
        w0, w1, c1, x1, b0, s1 = ev(), ev(), ev(), ev(), ev(), ev()
        h0 = time.perf_counter()
        w0.record()
        x = next(it)
        w1.record()
        host_wait_s += time.perf_counter() - h0
        x = x.to(dev)  # pageable: waits for the previous step's kernels, then the copy
        c1.record()
        loss = model(x).float().pow(2).mean()
        if args.pattern == "sync":
            loss.item()
            x1.record()
            end = time.perf_counter() + args.python_ms / 1000
            while time.perf_counter() < end:
                pass
            b0.record()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        s1.record()
        if args.pattern == "save" and (len(marks) + 1) % args.save_every == 0:
            v0, v1 = ev(), ev()
            v0.record()
            torch.save(model.state_dict(), os.path.join(save_dir, "model.pt"))
            v1.record()
            saves.append((v0, v1))
        marks.append({"prev": prev_end, "w0": w0, "w1": w1, "c1": c1, "x1": x1, "b0": b0, "s1": s1})
        prev_end = s1
    torch.cuda.synchronize()  # after the loop: the truth is read once the GPU is done
    wall_s = time.perf_counter() - t_start
    truth = _truth(args, marks, wall_s, host_wait_s, layers, saves)
    if not args.save_dir:
        shutil.rmtree(save_dir, ignore_errors=True)
    print(json.dumps(truth))
    if args.truth:
        with open(args.truth, "w") as fh:
            json.dump(truth, fh, indent=2)
    return 0


def _layers_for(torch: Any, dev: Any, width: int, rows: int, target_ms: float) -> int:
    """Linear layers whose forward + backward + AdamW take about ``target_ms`` on this GPU."""
    layer = torch.nn.Linear(width, width).to(dev)
    x = torch.randn(rows, width, device=dev)
    for _ in range(3):
        layer(x).sum().backward()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        layer(x).sum().backward()
    end.record()
    torch.cuda.synchronize()
    per_layer_ms = start.elapsed_time(end) / 10
    return max(1, round(target_ms / max(per_layer_ms, 1e-3)))


def _truth(args: argparse.Namespace, marks: list[dict[str, Any]], wall_s: float, host_wait_s: float,
           layers: int, saves: list[tuple[Any, Any]]) -> dict[str, Any]:
    steady = marks[len(marks) // 10:]  # the first tenth warms up (allocator, cuBLAS)
    step_ms = [m["prev"].elapsed_time(m["s1"]) for m in steady if m["prev"] is not None]
    idle_wait_ms = [m["w0"].elapsed_time(m["w1"]) for m in steady]
    copy_ms = [m["w1"].elapsed_time(m["c1"]) for m in steady]
    sync_idle_ms = [m["x1"].elapsed_time(m["b0"]) for m in steady] if args.pattern == "sync" else []
    save_ms = [a.elapsed_time(b) for a, b in saves]  # each in the interval of the step after it
    whole_s = marks[0]["s1"].elapsed_time(marks[-1]["s1"]) / 1000 if len(marks) > 1 else 0.0
    gpu_s = sum(step_ms) / 1000
    idle_s = (sum(idle_wait_ms) + sum(sync_idle_ms)) / 1000
    return {
        "pattern": args.pattern, "steps": len(marks), "layers": layers, "wall_s": round(wall_s, 3),
        "host_data_wait_share": round(host_wait_s / wall_s, 4),
        "gpu_step_ms_p50": round(statistics.median(step_ms), 3),
        "gpu_idle_in_wait_ms_p50": round(statistics.median(idle_wait_ms), 3),
        "gpu_idle_in_wait_share_of_gpu_time": round(sum(idle_wait_ms) / 1000 / gpu_s, 4) if gpu_s else None,
        "h2d_ms_p50": round(statistics.median(copy_ms), 3),
        "gpu_idle_after_sync_ms_p50": round(statistics.median(sync_idle_ms), 3) if sync_idle_ms else None,
        "gpu_busy_share_of_gpu_time": round(1 - idle_s / gpu_s, 4) if gpu_s else None,
        "saves": len(save_ms),
        "gpu_save_ms_p50": round(statistics.median(save_ms), 3) if save_ms else None,
        "gpu_save_share": round(sum(save_ms) / 1000 / whole_s, 4) if save_ms and whole_s else None,
        "expected": {"trap": "no data_stall; workers <= 1.1x", "sync": "host_sync",
                     "stall": "data_stall, workers", "save": "checkpoint_overhead"}[args.pattern],
    }


if __name__ == "__main__":
    sys.exit(main())
