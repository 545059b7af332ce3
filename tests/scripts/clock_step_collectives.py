"""Direct all-reduces in a one-rank gloo group, with the wall clock stepped 100 s forward halfway.

    python clock_step_collectives.py FOLDER

What an NTP step or a resumed VM does to ``time.time()`` mid-run, done to this process's clock alone.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpudoctor import hooks

folder = Path(sys.argv[1])
hooks.install(folder)
dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step() -> None:
    model(torch.ones(8, 64)).sum().backward()
    grads = torch.ones(1_000_000)
    dist.all_reduce(grads)
    time.sleep(0.05)  # apart from the next step's call, so each is a span of its own
    opt.step()
    opt.zero_grad()


for _ in range(3):
    step()
real = time.time
time.time = lambda: real() + 100.0  # the wall clock stepped forward
for _ in range(3):
    step()
dist.destroy_process_group()
hooks.uninstall()
