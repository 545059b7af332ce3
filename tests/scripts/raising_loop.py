"""A small real training loop whose own code raises through a call the doctor wraps.

``raising_loop.py backward``: a custom autograd Function's backward raises in step 3, so the
exception comes out of ``loss.backward()``. ``raising_loop.py getitem``: the Dataset's
``__getitem__`` raises for item 40, so it comes out of the DataLoader's ``next()``.
``raising_loop.py getitem-workers``: the same with one DataLoader worker. Bare and under
``gpudoctor run``, the traceback must be the same user frames and the same exception.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class PlantedError(ValueError):
    pass


class Faulty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise PlantedError("planted in the user's backward")


class Items(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == 40:
            raise PlantedError(f"planted in the user's __getitem__ for item {i}")
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


def train(where: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Items(), batch_size=8, num_workers=1 if where == "getitem-workers" else 0)
    for step, (x, y) in enumerate(loader, start=1):
        out = model(x)
        if where == "backward" and step == 3:
            out = Faulty.apply(out)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    train(sys.argv[1])
