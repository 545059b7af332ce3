"""A small training loop whose wall clock is stepped forward mid-run (``stepped_clock``): 80 steps of
about 50 ms; prints its own life and training seconds, on the monotonic clock, as JSON."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stepped_clock  # noqa: E402

born = time.monotonic()
stepped_clock.install()

import torch  # noqa: E402

model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
first = None
for _ in range(80):
    loss = model(torch.randn(64, 256)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    first = first if first is not None else time.monotonic()
    time.sleep(0.05)
print(json.dumps({"life_s": time.monotonic() - born, "training_s": time.monotonic() - first,
                  "startup_s": first - born}))
