"""A tiny real training loop for fault tests: DataLoader + Linear + SGD for --seconds S.

Prints ``step N`` lines on stdout (flushed) so a test can tell training has begun.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--crash", action="store_true", help="raise at once, before training")
    p.add_argument("--ignore-sigint", action="store_true", help="keep training through Ctrl-C")
    args, _ = p.parse_known_args()
    if args.crash:
        raise RuntimeError("planted crash before the first step")
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch  # after --crash: a crash at once should not wait for torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < deadline:
        for x, y in DataLoader(data, batch_size=8):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            time.sleep(0.005)
            if step % 20 == 1:
                print(f"step {step}", flush=True)
            if time.monotonic() >= deadline:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
