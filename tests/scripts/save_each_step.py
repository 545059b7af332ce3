"""A hand-written loop that saves a checkpoint after every step, fsyncs it and keeps the last two.

Its save interval is its own code, not a flag (no argparse): ``gpudoctor try`` can only thin its
``torch.save`` calls to measure a longer interval (tests/test_try_saves.py). Steps from $STEPS.
"""

import os
import sys
import tempfile

import torch

steps = int(os.environ.get("STEPS", "300"))
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
with tempfile.TemporaryDirectory() as folder:
    for step in range(1, steps + 1):
        loss = model(torch.randn(16, 512)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        path = os.path.join(folder, f"step-{step}.pt")
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        if step > 2:
            os.remove(os.path.join(folder, f"step-{step - 2}.pt"))
print("done", file=sys.stderr)
