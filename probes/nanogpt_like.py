"""Probe: a hand-written nanoGPT-style loop whose periodic eval is costly (planted: eval_overhead).

Mirrors karpathy/nanoGPT's ``train.py``: module-level config globals overridden by
``--key=value`` (its configurator; ``--key value`` works too), ``get_batch(split)`` drawing
random blocks from in-memory token arrays (no DataLoader), ``estimate_loss()`` decorated
with ``@torch.no_grad()`` that sets ``model.eval()``, averages ``eval_iters`` batches per
split and sets ``model.train()`` again, run every ``eval_interval`` iterations (iteration 0
included, before the first training step), followed by a ``torch.save`` checkpoint of
model + optimizer when ``iter_num > 0``; AdamW, grad clipping, cosine LR, no GradScaler
(CPU). Tiny GPT with random weights, synthetic tokens. The checkpoint folder is a temporary
directory removed at the end (unless ``--out_dir=...``).

Ground truth: ``eval_s`` = time inside ``estimate_loss()`` (the eval at iteration 0
included: it is evaluation, not startup), ``evals``, ``eval_batches`` (forward passes per
eval), ``eval_windows`` (epoch ``[start, end]`` of each, for a share over an attach window), ``checkpoint_s`` = time inside ``torch.save``, ``compute_s`` = the rest of the loop.
``startup_s`` ends where the training loop begins (just before the first eval).
"""

from __future__ import annotations

import ast
import math
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

PROBE = "nanogpt_like"

# -----------------------------------------------------------------------------
# default config values, nanoGPT-style globals (overridden by --key=value)
out_dir = ""  # empty: a temp dir, removed at the end
eval_interval = 20
eval_iters = 20
always_save_checkpoint = True
batch_size = 8
block_size = 64
vocab_size = 512
n_layer = 2
n_head = 2
n_embd = 96
learning_rate = 6e-4
max_iters = 160
weight_decay = 1e-1
grad_clip = 1.0
gradient_accumulation_steps = 1
decay_lr = True
warmup_iters = 10
min_lr = 6e-5
train_tokens = 200_000
truth = ""  # ground-truth JSON path (default: $GPUDOCTOR_PROBE_TRUTH)
seed = 0
threads = 1
# -----------------------------------------------------------------------------


def configure(argv: list[str]) -> None:
    """nanoGPT's configurator: ``--key=value`` (a Python literal, else a string) sets a global."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise SystemExit(f"unknown argument {arg!r} (use --key=value)")
        key, eq, val = arg[2:].partition("=")
        if not eq:  # --key value
            i += 1
            val = argv[i]
        if key not in globals() or key.startswith("_"):
            raise SystemExit(f"Unknown config key: {key}")
        try:
            value = ast.literal_eval(val)
        except (SyntaxError, ValueError):
            value = val
        default = globals()[key]
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        if not isinstance(value, type(default)):
            raise SystemExit(f"--{key}: expected {type(default).__name__}, got {val!r}")
        globals()[key] = value
        i += 1


class GPT(torch.nn.Module):
    """nanoGPT's call signature on the probes' tiny LM: ``model(idx, targets) -> (logits, loss)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = C.TinyCausalLM(vocab_size, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                 n_positions=block_size)

    def forward(self, idx, targets=None):
        logits = self.lm(input_ids=idx).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main() -> None:
    configure(sys.argv[1:])
    t = C.Truth(PROBE, "eval_overhead", truth or os.environ.get("GPUDOCTOR_PROBE_TRUTH") or None)
    t.enable("checkpoint_s", "compute_s", "eval_s")
    torch.set_num_threads(max(1, threads))
    torch.manual_seed(seed)

    gen = torch.Generator().manual_seed(seed)
    data = {"train": torch.randint(vocab_size, (train_tokens,), generator=gen),
            "val": torch.randint(vocab_size, (train_tokens // 10,), generator=gen)}

    def get_batch(split):
        d = data[split]
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([d[i:i + block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    t_opt = time.perf_counter()
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=learning_rate, betas=(0.9, 0.95))
    t.fields["optimizer_init_s"] = time.perf_counter() - t_opt

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                logits, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (learning_rate - min_lr)

    own_dir = not out_dir
    ckpt_dir = tempfile.mkdtemp(prefix="gpudoctor-probe-nanogpt-") if own_dir else out_dir
    os.makedirs(ckpt_dir, exist_ok=True)
    evals = saves = 0
    eval_windows: list[list[float]] = []  # epoch [start, end] of each eval: shares over any window
    best_val_loss = 1e9
    losses = {}

    t.mark_train_start()  # the loop starts here, with the eval at iteration 0
    X, Y = get_batch("train")
    iter_num = 0
    while True:
        t_iter = time.perf_counter()
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iter_num % eval_interval == 0:
            began = time.time()
            with t.timed("eval_s"):
                losses = estimate_loss()
            eval_windows.append([began, time.time()])
            evals += 1
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = float(losses["val"])
                if iter_num > 0:
                    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "iter_num": iter_num, "best_val_loss": best_val_loss}
                    with t.timed("checkpoint_s"):
                        torch.save(checkpoint, os.path.join(ckpt_dir, "ckpt.pt"))
                    saves += 1
        t_train = time.perf_counter()
        for _ in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t_end = time.perf_counter()
        t.add("compute_s", t_end - t_train)
        t.step_times.append(t_end - t_iter)
        iter_num += 1
        if iter_num > max_iters:
            break

    if own_dir:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    t.write(evals=evals, eval_windows=eval_windows, eval_batches=2 * eval_iters,
            eval_interval=eval_interval, checkpoints=saves, final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
