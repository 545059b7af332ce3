"""Probe: CPU-bound augmentation with an idle training process (planted: data_stall).

Each item is a small image (a seeded random tensor) put through a CPU-heavy augmentation chain in
``__getitem__`` (random resized crop by interpolation, flips, a colour jitter and a 7x7 blur,
repeated ``--passes`` times), then a tiny classifier trains on it. The model's step is short, so
with ``num_workers=0`` the training process spends most of its time building batches; the build
burns CPU (it does not wait), so the worker count is capped by the cores the run can have.
(Pillow is not installed on the dev box: the augmentation is torch ops on one thread, the same
kind of work.)

Ground truth: ``data_wait_s``, ``augment_s`` (inside the augmentation in this process),
``steady_steps_per_s``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROBE = "augment_cpu"


class AugmentedImages(Dataset):
    def __init__(self, n: int, size: int, passes: int, seed: int) -> None:
        self.n, self.size, self.passes, self.seed = n, size, passes, seed
        self.augment_s = 0.0
        self.blur = torch.ones(3, 1, 7, 7) / 49.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t = time.perf_counter()
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        img = torch.rand(1, 3, self.size, self.size, generator=g)
        for _ in range(self.passes):
            h = int(self.size * (0.6 + 0.4 * float(torch.rand(1, generator=g))))
            top = int(torch.randint(0, self.size - h + 1, (1,), generator=g))
            crop = img[:, :, top:top + h, top:top + h]
            img = F.interpolate(crop, size=(self.size, self.size), mode="bilinear", align_corners=False)
            if float(torch.rand(1, generator=g)) < 0.5:
                img = img.flip(-1)
            img = img * (0.8 + 0.4 * torch.rand(1, 3, 1, 1, generator=g))
            img = F.conv2d(F.pad(img, (3, 3, 3, 3), mode="reflect"), self.blur, groups=3)
        self.augment_s += time.perf_counter() - t
        return img[0], i % 10


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=96, help="image side in pixels")
    p.add_argument("--passes", type=int, default=6, help="augmentation passes per image")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0: the planted waste)")
    p.add_argument("--lr", type=float, default=1e-3)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "data_stall", C.truth_path(args))
    truth.enable("data_wait_s", "compute_s")
    ds = AugmentedImages(4096, args.size, args.passes, args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0, generator=torch.Generator().manual_seed(args.seed))
    model = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 10))
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    truth.mark_train_start()
    for _step, (x, y), _t_step, t_data in C.timed_batches(loader, truth, lambda s: s >= args.steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        truth.step_times.append(t_end - _t_step)
    truth.write(augment_s=ds.augment_s, num_workers=args.num_workers, final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
