"""Probe: a loader that waits on storage, not on CPU (planted: io_bound).

A map-style Dataset of pre-tokenized rows whose ``__getitem__`` waits ``--latency-ms`` per item
(a read from slow network storage: the worker sleeps, it burns no CPU), served by
``DataLoader(num_workers=0)``. The loop waits for every batch although the CPU is idle: more
workers (``--num-workers``) overlap the waits, and a worker blocked on I/O needs no core, so the
right count follows Little's law (build wall / step time), not the number of cores.

Ground truth: ``data_wait_s`` (time blocked in ``next``), ``latency_s`` (time asleep in
``__getitem__`` in this process), ``steady_steps_per_s``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROBE = "latency_loader"
VOCAB = 2000


class SlowStorageDataset(Dataset):
    def __init__(self, rows: list[list[int]], latency_s: float) -> None:
        self.rows = rows
        self.latency_s = latency_s
        self.slept_s = 0.0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> list[int]:
        t = time.perf_counter()
        time.sleep(self.latency_s)  # the read: blocked, no CPU
        self.slept_s += time.perf_counter() - t
        return self.rows[i]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--latency-ms", type=float, default=15.0, help="wait per item (default 15 ms)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0: the planted waste)")
    p.add_argument("--lr", type=float, default=3e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "io_bound", C.truth_path(args))
    truth.enable("data_wait_s", "compute_s")
    rng = random.Random(args.seed)
    rows = [[rng.randrange(4, VOCAB) for _ in range(args.seq_len)] for _ in range(args.rows)]
    ds = SlowStorageDataset(rows, args.latency_ms / 1000.0)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        collate_fn=functools.partial(C.collate_ids, pad=0),
                        persistent_workers=args.num_workers > 0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = C.TinyCausalLM(VOCAB)
    model.to(args.device)
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()
    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps, device=args.device)
    truth.write(**pads.fields(), latency_s=ds.slept_s, num_workers=args.num_workers,
                final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
