"""A real image loop on the CPU: PNG files decoded and resized with PIL in ``__getitem__``.

Writes ``--images`` small PNGs (default 16) into ``--data``, then trains a tiny conv net for
``--steps`` steps (default 6) with ``num_workers=0``. No tokenizer anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(a.images):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(data / f"{i}.png")

    class Photos(Dataset):
        def __init__(self, paths: list[Path]) -> None:
            self.paths = paths

        def __len__(self) -> int:
            return len(self.paths)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            img = Image.open(self.paths[i]).convert("RGB").resize((32, 32))
            return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255, i % 2

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    loader = DataLoader(Photos(sorted(data.glob("*.png"))), batch_size=4, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < a.steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= a.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
