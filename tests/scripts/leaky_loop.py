"""A small training loop that leaks memory the ways real loops do, or not (``--leak none``).

``--leak outputs``: each step's hidden activations are kept in a list as tensors with their graph
(``history.append(output)``: a tensor keeps its storage and its graph alive). ``--leak workers``: the
Dataset caches each item it builds, in each of 2 DataLoader workers (a copy per worker).
``none``: the healthy control, ``losses.append(loss.item())``. Runs ``--seconds`` of training.
``--truth FILE``: the loop's own measurement of its memory growth (the resident memory of this
process and its workers, read with psutil at each step), as MiB per hour over the loop's last two thirds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

# 2 workers build a batch in about 5 ms of CPU, far under the 40 ms period; a step of the outputs loop
# takes about 1 ms of CPU, far under its 12.5 ms (beside two busy programs its rate fell mid-run: late
# slope 0.35 of the whole, where the rule's levelling-off line is 0.5)
# the healthy control too: unpaced (a 5 ms sleep a step) it kept 0.7 of one of the suite's two cores busy
STEPS_PER_S = {"workers": 25, "outputs": 80, "none": 25}
# an item's rows: the outputs loop keeps each step's hidden activations, 8 x rows x 512 floats (16 rows:
# 256 kB a step, about 20 MiB/s; at 256 rows it kept 4 MiB a step, 8 GiB over the test's then 24 s, and on
# CI the tree's resident memory fell in the loop's second half as the host ran short)
ROWS = {"none": 256, "workers": 256, "outputs": 16}


class Items(Dataset):  # type: ignore[type-arg]
    def __init__(self, cache: bool, rows: int) -> None:
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None
        self.rows = rows

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.randn(self.rows, 64)
        if self.cache is not None:
            # a decoded item kept for ever, in this worker (512 kB: the main process's own memory moves
            # by 100-250 MiB under a busy host while its workers feed it, as a real loop's does, and the
            # leak must stand above that within the 12 s half-window the test draws its line over; filled,
            # not drawn at random: resident for a few microseconds of CPU, where a busy host has none)
            self.cache[i] = torch.full((256, 512), float(i))
        return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leak", choices=("none", "outputs", "workers"), default="none")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--truth", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    workers = 2 if args.leak == "workers" else 0
    loader = DataLoader(Items(args.leak == "workers", ROWS[args.leak]), batch_size=8, num_workers=workers)
    kept: list[object] = []
    samples: list[tuple[float, float]] = []
    me = psutil.Process()
    start = time.time()
    end = start + args.seconds
    for steps, x in enumerate(loader, 1):
        samples.append((time.time(), _tree_rss_mib(me)))
        hidden = model[1](model[0](x))
        loss = model[2](hidden).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept.append(hidden if args.leak == "outputs" else loss.item())
        # paced: the leaks are per step (an item, an output), so a steady rate of steps is a steady leak
        # in time, however busy the machine (CI: the rate halved mid-run)
        time.sleep(max(0.0, start + steps / STEPS_PER_S[args.leak] - time.time()))
        if time.time() > end:
            break
    if args.truth:  # a least-squares line through every step's reading, past the loop's first third
        cut = samples[0][0] + (samples[-1][0] - samples[0][0]) / 3  # (workers forking: growth that stops)
        samples = [(t, m) for t, m in samples if t >= cut]
        ts, ms = [t for t, _ in samples], [m for _, m in samples]
        mt, mm = sum(ts) / len(ts), sum(ms) / len(ms)
        slope = sum((t - mt) * (m - mm) for t, m in samples) / sum((t - mt) ** 2 for t in ts)
        with open(args.truth, "w") as fh:
            json.dump({"growth_mib_per_hour": slope * 3600, "steps": len(samples)}, fh)


def _tree_rss_mib(me: psutil.Process) -> float:
    procs = [me, *me.children(recursive=True)]
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


if __name__ == "__main__":
    main()
