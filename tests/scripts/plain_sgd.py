"""A plain SGD loop on tensors: no optimizer, no DataLoader, manual ``p -= lr * p.grad``.

What ``attach`` must recognise as already training from its backward passes and
parameter updates. Runs ``--seconds S`` (default 12) or until ``--until-file F`` exists,
printing ``step <n>`` every 50 steps, then prints ``STEPS=<n>``.
"""

from __future__ import annotations

import os
import sys
import time

import torch


def main() -> None:
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 12.0
    until = sys.argv[sys.argv.index("--until-file") + 1] if "--until-file" in sys.argv else None
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    x, y = torch.randn(512, 64), torch.randn(512, 1)
    steps, end = 0, time.monotonic() + seconds
    while time.monotonic() < end and not (until and steps % 50 == 0 and os.path.exists(until)):
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
                p.grad = None
        steps += 1
        if steps % 50 == 0:
            print(f"step {steps}", flush=True)
    print(f"STEPS={steps}", flush=True)


if __name__ == "__main__":
    main()
