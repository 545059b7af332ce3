"""A small real training loop that raises in step ``--crash-at`` (default 60).

DataLoader + Linear + SGD, a few ms of work a step; ``--steps`` it would run without the crash.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--crash-at", type=int, default=60)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=16), start=1):
        if step == args.crash_at:
            raise RuntimeError(f"planted crash in step {step}")
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.005)
        if step >= args.steps:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
