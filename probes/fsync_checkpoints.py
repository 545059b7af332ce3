"""Probe: a hand-written loop that saves an fsync'd checkpoint every step (planted: checkpoint_overhead).

The save interval is the script's own code (``--save-every``), so ``gpudoctor try`` cannot set
it; it can thin the loop's ``torch.save`` calls in its trial (keep every k-th) and measure what
``save_every × k`` gives. Each save writes the model and AdamW state to an open file, then
``flush`` + ``os.fsync`` (a save that really reaches the disk), then deletes the oldest beyond
``--keep``. Plain PyTorch loop.

Apply the fix through the probe's own flag: ``--save-every N``.

Ground truth: ``checkpoint_s`` (seconds inside the saves: write, fsync, rotation), ``checkpoints``; ``step_times_s``:
each optimizer step's seconds, its save included (for steady-state steps/s).
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

PROBE = "fsync_checkpoints"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    p.add_argument("--save-every", type=int, default=1, help="checkpoint every N steps (default 1)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept on disk (default 2)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--out-dir", default=None, help="checkpoint folder (default: a temp dir, removed)")
    p.add_argument("--lr", type=float, default=1e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "checkpoint_overhead", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tok = C.get_tokenizer(seed=args.seed)
    n_blocks = (args.steps + 1) * args.batch_size
    texts = C.make_corpus(max(64, n_blocks), seed=args.seed + 3, median_words=40)
    ids = C.packed_blocks(tok, texts, n_blocks, args.seq_len)
    loader = DataLoader(TensorDataset(ids), batch_size=args.batch_size, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = C.TinyCausalLM(tok.get_vocab_size(), n_embd=args.n_embd, n_layer=args.n_layer, n_head=4)
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()
    own_dir = args.out_dir is None
    out_dir = tempfile.mkdtemp(prefix="gpudoctor-probe-fsync-") if own_dir else args.out_dir
    os.makedirs(out_dir, exist_ok=True)
    saved: list[str] = []
    saves = 0

    cpu = [time.process_time()]  # CPU seconds per step (an fsync's wait for the disk is not in it)
    truth.mark_train_start()
    loss = None
    for step, (x,), t_step, t_data in C.timed_batches(loader, truth, lambda n: n >= args.steps):
        mask = torch.ones_like(x)
        pads.add(mask)
        loss = model(input_ids=x, attention_mask=mask, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        truth.add("compute_s", time.perf_counter() - t_data)
        if step % args.save_every == 0:
            path = os.path.join(out_dir, f"checkpoint-{step}.pt")
            t = time.perf_counter()
            with open(path, "wb") as fh:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            saved.append(path)
            while len(saved) > max(1, args.keep):  # rotating old checkpoints is part of saving
                os.remove(saved.pop(0))
            truth.add("checkpoint_s", time.perf_counter() - t)
            saves += 1
        truth.step_times.append(time.perf_counter() - t_step)
        cpu.append(time.process_time())

    if own_dir:
        shutil.rmtree(out_dir, ignore_errors=True)
    truth.write(**pads.fields(), checkpoints=saves, save_every=args.save_every,
                step_times_s=list(truth.step_times), step_cpu_s=[b - a for a, b in zip(cpu, cpu[1:], strict=False)],
                final_loss=float(loss.detach()) if loss is not None else None)


if __name__ == "__main__":
    main()
