"""The HF Trainer, Lightning and Accelerate, whose results must be bit-identical bare and under the
doctor (issue #39). ``python transparency_frameworks.py OUT [CASE ...]``: one interpreter, each case
in a forked child (``_transparency.py``), one JSON line per case in OUT (sha256 of the final weights
and of what the framework saved). Tiny models built from configs, random token ids: nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _transparency import run_forked

STEPS = 4


def digest(*states: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for state in states:
        for k, t in state.items():
            h.update(k.encode())
            if isinstance(t, torch.Tensor):
                h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def tokens(n: int, vocab: int = 64, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(3))


def hf_trainer() -> str:
    """``Trainer.train`` on a tiny GPT-2, saving a checkpoint at step 2 and evaluating, then the model
    deep-copied and saved whole."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    ids = tokens(STEPS * 4)
    data = [{"input_ids": r, "labels": r} for r in ids]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    out = tempfile.mkdtemp(prefix="transparency-hf-")
    args = TrainingArguments(output_dir=out, max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-3,
                             save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                             report_to=[], logging_steps=1, seed=0, data_seed=0, use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
    trainer.train()
    copy.deepcopy(trainer.model)
    torch.save(trainer.model, Path(out) / "whole.pt")
    saved = torch.load(Path(out) / "whole.pt", weights_only=False)
    return digest(model.state_dict(), saved.state_dict())


def lightning_fit() -> str:
    """``Trainer.fit`` with a checkpoint each epoch and validation; the module then saved whole."""
    import lightning as L

    Module = _lightning_module()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 12, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2))
    val = torch.utils.data.DataLoader(data, batch_size=4)
    module = Module()
    out = tempfile.mkdtemp(prefix="transparency-lightning-")
    trainer = L.Trainer(max_epochs=2, default_root_dir=out, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(module, loader, val)
    ckpt = torch.load(next(Path(out).rglob("*.ckpt")), weights_only=False)
    whole = Path(out) / "whole.pt"
    torch.save(module, whole)
    torch.load(whole, weights_only=False)
    return digest(module.state_dict(), ckpt["state_dict"], {"epoch": torch.tensor(ckpt["epoch"])})


def accelerate_loop() -> str:
    """An Accelerate loop with gradient accumulation and an EMA copy made after the first step."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 8, 12, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2))
    model, opt, loader = acc.prepare(model, opt, loader)
    ema = None
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).pow(2).mean())
            opt.step()
            opt.zero_grad()
        if ema is None and acc.sync_gradients:
            ema = copy.deepcopy(acc.unwrap_model(model))
    assert ema is not None
    folder = tempfile.mkdtemp(prefix="transparency-accelerate-")
    acc.save_state(folder)
    return digest(acc.unwrap_model(model).state_dict(), ema.state_dict())


def _lightning_module() -> Any:
    """The LightningModule class, made at module level (``torch.save`` of the module pickles its class)."""
    global LitNet
    import lightning as L

    class LitNet(L.LightningModule):  # type: ignore[no-redef]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                           torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, i: int) -> None:
            self.log("val", self.net(batch[0]).mean())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    LitNet.__qualname__ = "LitNet"
    return LitNet


LitNet: Any = None

CASES: dict[str, Callable[[], str]] = {"hf_trainer": hf_trainer, "lightning": lightning_fit,
                                       "accelerate": accelerate_loop}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("cases", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    run_forked(CASES, args.cases, args.out)


if __name__ == "__main__":
    main()
