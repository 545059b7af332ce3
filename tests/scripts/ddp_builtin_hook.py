"""A DDP loop that registers DDP's C++ built-in all-reduce hook before training (run under torchrun)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 8))
model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # takes DDP's one hook slot
opt = torch.optim.SGD(model.parameters(), 0.1)
for _ in range(5):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
