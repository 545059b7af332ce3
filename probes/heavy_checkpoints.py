"""Probe: torch.save of model + optimizer state every N steps (planted: checkpoint_overhead).

A plain PyTorch loop over pre-tokenized, packed (pad-free) blocks with a model that is wide
for its workload (~8M parameters, ~100 MB checkpoint with AdamW state), saving
``{"model": state_dict, "optimizer": state_dict}`` with ``torch.save`` to
``<out>/checkpoint-<step>.pt`` every ``--save-every`` steps, keeping all of them (like
``save_total_limit=None``; ``--keep K`` keeps the last K).
Everything else is healthy: no tokenization in the loop, no padding, small data wait.
The output folder is a temporary directory removed at the end (unless ``--out-dir``).

Ground truth: ``checkpoint_s`` = time inside the ``torch.save`` calls; ``checkpoints`` = how
many; ``checkpoint_mb`` = size of one checkpoint file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

PROBE = "heavy_checkpoints"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32, help="optimizer steps (default 32)")
    p.add_argument("--save-every", type=int, default=1, help="checkpoint every N steps (default 1)")
    p.add_argument("--keep", type=int, default=0,
                   help="checkpoints kept on disk, 0 = all, like save_total_limit=None (default 0)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=16, help="packed block length (default 16)")
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--out-dir", default=None, help="checkpoint folder (default: a temp dir, removed)")
    p.add_argument("--lr", type=float, default=1e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "checkpoint_overhead", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tok = C.get_tokenizer(seed=args.seed)
    n_blocks = args.steps * args.batch_size + args.batch_size
    texts = C.make_corpus(max(64, n_blocks), seed=args.seed + 3, median_words=40)
    with truth.timed("tokenize_s"):
        ids = C.packed_blocks(tok, texts, n_blocks, args.seq_len)
    loader = DataLoader(TensorDataset(ids), batch_size=args.batch_size, shuffle=True,
                        num_workers=0, generator=torch.Generator().manual_seed(args.seed))

    model = C.TinyCausalLM(tok.get_vocab_size(), n_embd=args.n_embd, n_layer=args.n_layer,
                           n_head=4)
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()
    own_dir = args.out_dir is None
    out_dir = tempfile.mkdtemp(prefix="gpudoctor-probe-ckpt-") if own_dir else args.out_dir
    os.makedirs(out_dir, exist_ok=True)
    saved: list[str] = []
    ckpt_mb = None

    truth.mark_train_start()
    step = 0
    for step, (x,), t_step, t_data in C.timed_batches(loader, truth, lambda n: n >= args.steps):
        mask = torch.ones_like(x)
        pads.add(mask)
        loss = model(input_ids=x, attention_mask=mask, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_comp = time.perf_counter()
        truth.add("compute_s", t_comp - t_data)
        if step % args.save_every == 0:
            path = os.path.join(out_dir, f"checkpoint-{step}.pt")
            t = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step}, path)
            truth.add("checkpoint_s", time.perf_counter() - t)
            saved.append(path)
            if ckpt_mb is None:
                ckpt_mb = os.path.getsize(path) / 1e6
            while args.keep > 0 and len(saved) > args.keep:
                os.remove(saved.pop(0))
        truth.step_times.append(time.perf_counter() - t_step)

    n_ckpt = step // args.save_every
    if own_dir:
        shutil.rmtree(out_dir, ignore_errors=True)
    truth.write(**pads.fields(), checkpoints=n_ckpt, checkpoint_mb=ckpt_mb,
                save_every=args.save_every, final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
