"""A real DataLoader loop whose batches wait on a slow ``__getitem__``: a worker count fixes it.

Each item sleeps ``--item-ms`` (I/O-like: it needs no core), the model step is tiny, so the loop
waits for data. Right after building its loader, the script writes the loader's own settings
to ``<--loader-file>.<pid>.json``, so a test sees what the DataLoader really got.
``--worker-item-ms`` is an item's wait in a loader worker instead (storage that serves parallel
readers slower, a contended disk or a rate-limited bucket: what no model of the recording can
see). Runs ``--steps`` steps (large by default: ``gpudoctor try`` stops it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


class SlowItems:
    def __init__(self, n: int, item_s: float, worker_item_s: float) -> None:
        import torch

        self.x = torch.randn(n, 16)
        self.y = torch.randn(n, 1)
        self.item_s = item_s
        self.worker_item_s = worker_item_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        from torch.utils.data import get_worker_info

        time.sleep(self.item_s if get_worker_info() is None else self.worker_item_s)
        return self.x[i], self.y[i]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--item-ms", type=float, default=10.0)
    p.add_argument("--worker-item-ms", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--loader-file", default=None)
    args = p.parse_args()
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    worker_ms = args.item_ms if args.worker_item_ms is None else args.worker_item_ms
    loader = DataLoader(SlowItems(4096, args.item_ms / 1000, worker_ms / 1000), batch_size=args.batch_size,
                        shuffle=True)
    if args.loader_file:
        with open(f"{args.loader_file}.{os.getpid()}.json", "w") as fh:
            json.dump({"num_workers": loader.num_workers, "persistent_workers": loader.persistent_workers,
                       "prefetch_factor": loader.prefetch_factor}, fh)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
