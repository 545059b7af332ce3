"""A torch.distributed-style process that blocks in ``TCPStore.get`` until the test sets "go".

Stands for a rank inside ``init_process_group``: a debugger stop there made c10d raise
``DistNetworkError`` and killed the job. Prints WAITING once blocked, then trains a few
steps of a tiny model (until ``argv[1]`` seconds pass or the test sets "stop") and prints OK with
the value it received.
"""

import datetime
import os
import sys
import time

import torch
from torch.distributed import TCPStore

store = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 2, False,
                 timeout=datetime.timedelta(seconds=120))
print("WAITING", flush=True)
value = store.get("go").decode()
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + float(sys.argv[1])
while time.time() < end and not store.check(["stop"]):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
print("OK", value, flush=True)
