"""Does a new row width every step cost more than one width each step (per-batch padding on a CPU)?

Per-batch padding gives every batch its own width; the length-cost timing measures each width back
to back. This times a GPT-2 (random weights, forward, backward, AdamW) at one width and at widths
drawn at random around it, interleaved, and prints the ratio of the mean step at random widths to
the same widths timed one at a time (1.0: no cost for a new shape).

    python bench/width_jitter.py --n-embd 32 --n-layer 2 --rows 16 --lo 100 --hi 176
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def main() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-embd", type=int, default=32)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--lo", type=int, default=100)
    ap.add_argument("--hi", type=int, default=176)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=4000, n_layer=args.n_layer, n_embd=args.n_embd, n_head=4,
                                       n_positions=max(2048, args.hi)))
    opt = torch.optim.AdamW(model.parameters(), 1e-4)

    def step(width: int) -> float:
        x = torch.randint(0, 4000, (args.rows, width))
        t = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t

    mid = (args.lo + args.hi) // 2
    for _ in range(3):
        step(mid)
    rng = random.Random(1)
    varied, widths = [], []
    for _ in range(args.rounds):
        ws = [rng.randint(args.lo, args.hi) for _ in range(8)]
        widths += ws
        varied += [step(w) for w in ws]
    alone = {}
    for w in sorted(set(widths)):
        step(w)
        alone[w] = statistics.median(step(w) for _ in range(3))
    same = statistics.mean(alone[w] for w in widths)
    print(f"random widths {args.lo}-{args.hi}: {1e3 * statistics.mean(varied):.1f} ms a step; the same widths one "
          f"at a time: {1e3 * same:.1f} ms; ratio {statistics.mean(varied) / same:.3f}")


if __name__ == "__main__":
    main()
