"""A real training loop whose batches the hooks cannot count: a sparse attention mask.

Exits 0 on its own. ``--own-profiler`` wraps the loop in the user's own
torch.profiler, the way people profile themselves. ``--steps N`` sets the length.
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--own-profiler", action="store_true")
    args, _ = p.parse_known_args()
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class Rows(Dataset):
        def __len__(self) -> int:
            return args.steps * 4

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            mask = torch.zeros(16, dtype=torch.long)
            mask[: 4 + i % 12] = 1
            return {"input_ids": torch.arange(16) * mask, "attention_mask": mask}

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        ids = torch.stack([r["input_ids"] for r in rows])
        mask = torch.stack([r["attention_mask"] for r in rows]).to_sparse()  # sparse COO
        return {"input_ids": ids, "attention_mask": mask}

    model = torch.nn.Sequential(
        torch.nn.Embedding(16, 8), torch.nn.Flatten(), torch.nn.Linear(128, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        if args.own_profiler
        else contextlib.nullcontext()
    )
    steps = 0
    with own:
        for batch in DataLoader(Rows(), batch_size=4, collate_fn=collate):
            out = model(batch["input_ids"] * batch["attention_mask"].to_dense())
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            steps += 1
    if args.own_profiler and not own.key_averages():
        print("the user's own profiler recorded nothing", file=sys.stderr)
        return 3
    print(f"trained {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
