"""A GPT-2 (124M) shape trained on CUDA in bf16 or fp32, with its FLOPs counted by hand.

    gpudoctor run --out runs/mfu-bf16 -- python probes/gpu_mfu.py --precision bf16 --truth runs/mfu-bf16.truth.json

The report's MFU is model FLOPs per step over the GPU's step time over the datasheet peak; this
probe gives the two measured inputs independently of gpudoctor (which it never imports): the
FLOPs counted by hand from the config (``hand_flops_per_step``: per token 6 x the matmul weights,
12 d^2 a block plus the vocabulary head, plus 12 L T d of attention, the PaLM count), and the step
time on the GPU's own clock (a ``torch.cuda.Event`` at each step end, read after the loop). Random
weights from a config, random tokens: nothing is downloaded. Needs CUDA: without it, one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any


def hand_flops_per_token(n_layer: int, d: int, vocab: int, seq_len: int) -> float:
    """Training FLOPs of one token: 6 x (12 d^2 per block + the d x vocab head) + 12 L T d."""
    matmul_params = n_layer * 12 * d * d + d * vocab
    return 6.0 * matmul_params + 12.0 * n_layer * seq_len * d


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--truth", default=os.environ.get("GPUDOCTOR_PROBE_TRUTH"))
    args = p.parse_args(argv)
    import torch
    from torch.utils.data import DataLoader
    from transformers import GPT2Config, GPT2LMHeadModel

    if not torch.cuda.is_available():
        print("gpu_mfu: CUDA is not available; run this probe on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, vocab_size=args.vocab,
                        n_positions=args.seq_len)
    model = GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch_size * 8, args.seq_len))
    # collated into a dict of 2-D token tensors, with the mask a tokenizer gives (GPT-2 has no pad id:
    # without a mask the doctor cannot count the batch's tokens)
    rows = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
    loader = DataLoader(rows, batch_size=args.batch_size, shuffle=False)
    ends: list[Any] = []
    t0 = time.perf_counter()
    step = 0
    while step < args.steps:
        for batch in loader:
            batch = {k: v.to("cuda") for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            ends.append(end)
            step += 1
            if step >= args.steps:
                break
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - t0
    steady = ends[max(3, len(ends) // 5):]
    step_ms = [a.elapsed_time(b) for a, b in zip(steady, steady[1:], strict=False)]
    tokens = args.batch_size * args.seq_len
    per_token = hand_flops_per_token(args.n_layer, args.n_embd, args.vocab, args.seq_len)
    truth = {"probe": "gpu_mfu", "precision": args.precision, "steps": len(ends), "wall_s": round(wall_s, 3),
             "params": sum(q.numel() for q in model.parameters()), "tokens_per_step": tokens,
             "hand_flops_per_token": per_token, "hand_flops_per_step": per_token * tokens,
             "gpu_step_ms_p50": round(statistics.median(step_ms), 3), "device_name": torch.cuda.get_device_name(),
             "final_loss": float(loss.detach())}
    print(json.dumps(truth))
    if args.truth:
        with open(args.truth, "w") as fh:
            json.dump(truth, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
