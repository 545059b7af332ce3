"""A loop that crashes at its end, through the doctor's code or past it (issue #39's crash words).

``--ours``: a wrapper of the doctor's raises itself (its ``apply.active`` broken, as a bug would);
``--through``: the script saves an object that cannot be pickled, and the error passes through the
doctor's ``torch.save`` wrapper; neither: the script raises in its own code.
"""

from __future__ import annotations

import argparse
import io
import sys
import threading

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", action="store_true")
    ap.add_argument("--through", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    if args.ours:
        apply = sys.modules.get("gpudoctor.hooks.apply")
        if apply is not None:
            apply.active = None  # type: ignore[attr-defined]  # what a bug in the doctor's wrapper would do
    if args.ours or args.through:
        torch.save({"model": net.state_dict(), "lock": threading.Lock() if args.through else None}, io.BytesIO())
    raise RuntimeError("the script's own error")


if __name__ == "__main__":
    main()
