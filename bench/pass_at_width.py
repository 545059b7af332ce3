"""What a pass costs at one row width: an all-ones mask, padding inside the rows, a new width each pass.

The length-cost timing (gpudoctor/launch/length_cost_worker.py) times the recorded architecture at
fixed widths with an all-ones mask; a loop padded per batch runs rows with padding inside them at
a width that changes every batch. This times a GPT-2 (random weights, forward, backward, AdamW) at
``--width`` the three ways, interleaved per round, and prints each median and its ratio to the first;
then the widths the third way drew, each timed alone after a warm-up pass at it, against the
same widths met one after another (1.0: a new width each pass costs nothing).

    python bench/pass_at_width.py --n-embd 128 --n-layer 2 --width 560 --threads 1
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
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=1)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--width", type=int, default=192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=4000, n_layer=args.n_layer, n_embd=args.n_embd, n_head=4,
                                       n_positions=max(1024, 2 * args.width), pad_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    rng = random.Random(0)

    def step(width: int, padded: bool) -> float:
        ids = torch.randint(1, 4000, (args.rows, width))
        mask = torch.ones_like(ids)
        if padded:  # every row but the first shorter than the width, as per-batch padding leaves them
            for r in range(1, args.rows):
                n = max(8, int(width * rng.uniform(0.2, 1.0)))
                mask[r, n:] = 0
                ids[r, n:] = 0
        t = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    w = args.width
    drawn: list[int] = []

    def jittered() -> float:
        drawn.append(rng.randint(int(w * 0.85), int(w * 1.15)))
        return step(drawn[-1], True)

    ways = {"all-ones mask, one width": lambda: step(w, False), "padding inside the rows": lambda: step(w, True),
            "padded, a width within 15% each pass": jittered}
    for fn in ways.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            times[name].append(fn())
    base = statistics.median(times["all-ones mask, one width"])
    for name, ts in times.items():
        print(f"{name:38s} {1e3 * statistics.median(ts):8.1f} ms  ratio {statistics.median(ts) / base:.3f}")
    met = times["padded, a width within 15% each pass"]
    drawn = drawn[-len(met):]
    alone = []
    for width in drawn:  # the same widths, each after a warm-up pass at it
        step(width, True)
        alone.append(step(width, True))
    print(f"{'the drawn widths met in turn / alone':38s} {1e3 * statistics.mean(met):8.1f} ms / "
          f"{1e3 * statistics.mean(alone):.1f} ms  ratio {statistics.mean(met) / statistics.mean(alone):.3f}")


if __name__ == "__main__":
    main()
