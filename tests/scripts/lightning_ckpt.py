"""A small real Lightning fit that checkpoints with ``ModelCheckpoint(every_n_train_steps=N)``.

The script times its own saves (every ``ModelCheckpoint._save_checkpoint``, which is the whole
``trainer.save_checkpoint``: state dump, ``torch.save`` into a buffer, the CheckpointIO's write)
and writes the truth as JSON to ``--truth``: ``save_s``, ``saves``, ``fit_s``. Options:
``--every N`` (``every_n_train_steps``), ``--steps S``, ``--mb`` (checkpoint size, roughly),
``--crash-at K`` (raise in step K), ``--no-input-ids`` is not here: see ``collator_loop.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--mb", type=float, default=24.0)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--val-every", type=int, default=0, help="val_check_interval in steps (0: no validation)")
    p.add_argument("--val-batches", type=int, default=40, help="limit_val_batches")
    p.add_argument("--no-ckpt", action="store_true", help="enable_checkpointing=False")
    p.add_argument("--truth", default="")
    p.add_argument("--dir", default="")
    args = p.parse_args()

    import lightning
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    width = 256
    # Adam keeps two more copies: parameters ~ mb / 3 of float32.
    rows = max(1, int(args.mb * 1e6 / 4 / 3 / width))
    saved = {"s": 0.0, "n": 0}

    class TimedCheckpoint(ModelCheckpoint):
        def _save_checkpoint(self, trainer, filepath):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            super()._save_checkpoint(trainer, filepath)
            saved["s"] += time.perf_counter() - t0
            saved["n"] += 1

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(16, width)
            self.big = torch.nn.Embedding(rows, width)  # weight only: its size is the checkpoint's
            self.out = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if args.crash_at and self.global_step + 1 >= args.crash_at:
                raise RuntimeError(f"planted crash in step {self.global_step + 1}")
            x, y = batch
            h = torch.relu(self.inp(x))
            for _ in range(12):
                h = torch.tanh(h @ self.inp.weight @ self.inp.weight.T / width)
            loss = torch.nn.functional.mse_loss(self.out(h + self.big.weight[:1]), y)
            return loss

        def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            h = torch.relu(self.inp(x))
            for _ in range(12):
                h = torch.tanh(h @ self.inp.weight @ self.inp.weight.T / width)
            return torch.nn.functional.mse_loss(self.out(h), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    folder = args.dir or tempfile.mkdtemp(prefix="lightning-ckpt-")
    ckpt = TimedCheckpoint(dirpath=folder, every_n_train_steps=args.every, save_top_k=1)
    val = {"val_check_interval": args.val_every, "limit_val_batches": args.val_batches} if args.val_every else {
        "limit_val_batches": 0}
    trainer = lightning.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                                callbacks=[] if args.no_ckpt else [ckpt], enable_checkpointing=not args.no_ckpt,
                                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                default_root_dir=folder, **val)
    t0 = time.perf_counter()
    try:
        trainer.fit(Module(), DataLoader(data, batch_size=32, shuffle=True),
                    DataLoader(data, batch_size=32) if args.val_every else None)
    finally:
        truth = {"save_s": saved["s"], "saves": saved["n"], "fit_s": time.perf_counter() - t0,
                 "steps": trainer.global_step}
        if args.truth:
            Path(args.truth).write_text(json.dumps(truth))
        print(json.dumps(truth), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
