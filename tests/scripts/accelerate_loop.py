"""A real Accelerate loop on the CPU: ``Accelerator(cpu=True)``, ``--steps`` steps (default 6),
``accelerator.save_state`` every ``--save-every`` steps (default 3) into ``--out``."""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--out", default="accelerate-out")
    a = p.parse_args()
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
    for step, (x, y) in enumerate(loader, start=1):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if step % a.save_every == 0:
            accelerator.save_state(a.out)
        if step >= a.steps:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
