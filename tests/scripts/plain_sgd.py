"""A plain SGD loop on tensors: no optimizer, no DataLoader, manual ``p -= lr * p.grad``.

What ``attach`` must recognise as already training from its backward passes and
parameter updates. Runs ``--seconds S`` (default 12), then prints ``STEPS=<n>``.
"""

from __future__ import annotations

import sys
import time

import torch


def main() -> None:
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 12.0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    x, y = torch.randn(512, 64), torch.randn(512, 1)
    steps, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
                p.grad = None
        steps += 1
    print(f"STEPS={steps}", flush=True)


if __name__ == "__main__":
    main()
