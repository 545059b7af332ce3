"""DDP loops whose weights must be bit-identical bare and under the doctor (issue #39, audit #34 row 5).

Run with ``torchrun --nproc-per-node 2 transparency_ddp.py OUT``: 2 gloo ranks, one interpreter each
running every case in turn; each rank appends ``{"case", "rank", "sha256"}`` lines (its final
weights' bytes) to ``OUT.rank<r>``. Rank 1 gets fewer batches in the ``join`` cases (uneven inputs).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batches(rank: int, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(n):
        yield torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(model: DDP, rank: int, n: int, ctx: Callable[[], AbstractContextManager[Any]] = nullcontext,
          accum: int = 1) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ctx():
        for i, (x, y) in enumerate(batches(rank, n)):
            last = (i + 1) % accum == 0
            with model.no_sync() if not last else nullcontext():
                torch.nn.functional.mse_loss(model(x), y).backward()
            if last:
                opt.step()
                opt.zero_grad()


def user_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not strings
    """A script's own hook: DDP's default all-reduce in Python (what a user's hook starts from)."""
    return default_hooks.allreduce_hook(state, bucket)


def cases(rank: int) -> dict[str, Callable[[], torch.nn.Module]]:
    uneven = STEPS + 2 if rank == 0 else STEPS

    def plain() -> torch.nn.Module:
        m = DDP(net())
        train(m, rank, STEPS)
        return m

    def join(divide: bool) -> Callable[[], torch.nn.Module]:
        def run() -> torch.nn.Module:
            m = DDP(net())
            train(m, rank, uneven, lambda: m.join(divide_by_initial_world_size=divide))
            return m
        return run

    def no_sync() -> torch.nn.Module:
        m = DDP(net())
        train(m, rank, STEPS * 2, accum=2)
        return m

    def their_hook() -> torch.nn.Module:
        m = DDP(net())
        m.register_comm_hook(dist.group.WORLD, user_hook)
        train(m, rank, STEPS)
        return m

    def their_hook_with_join() -> torch.nn.Module:
        m = DDP(net())
        m.register_comm_hook(dist.group.WORLD, user_hook)
        train(m, rank, uneven, lambda: m.join(divide_by_initial_world_size=False))
        return m

    def static_graph() -> torch.nn.Module:
        m = DDP(net(), static_graph=True)
        train(m, rank, STEPS)
        return m

    return {"ddp_plain": plain, "ddp_join_effective_world": join(False), "ddp_join_initial_world": join(True),
            "ddp_no_sync": no_sync, "ddp_user_hook": their_hook, "ddp_user_hook_join": their_hook_with_join,
            "ddp_static_graph": static_graph}


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    lines = []
    for name, case in cases(rank).items():
        model = case()
        lines.append(json.dumps({"case": name, "rank": rank, "sha256": digest(model)}))
        dist.barrier()
    with open(f"{out}.rank{rank}", "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
