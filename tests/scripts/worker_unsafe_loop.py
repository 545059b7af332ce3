"""A real loop whose batches are slow to build (CPU work in ``__getitem__``) and whose dataset
cannot run in a DataLoader worker (it raises there, as one holding an open database handle would).

Under ``gpudoctor try`` the data fix (``num_workers``) crashes the trial: the crash must be said.
Runs ``--steps`` steps (default 400) with ``num_workers=0`` as written.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    torch.set_num_threads(1)

    class Records(Dataset):
        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if get_worker_info() is not None:
                raise RuntimeError("records handle opened in the main process cannot be used in a worker")
            end = time.process_time() + 0.002  # decoding a record: CPU work
            while time.process_time() < end:
                pass
            return torch.full((32,), float(i % 7)), torch.tensor([float(i % 3)])

    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(Records(), batch_size=8), start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= args.steps:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
