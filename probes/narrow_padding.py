"""Probe: a narrow model (hidden 64) on rows padded to 1024 whose p99 is ~220 (planted: padding_waste).

The corpus is tokenized once, before the loop, with the Hugging Face fast tokenizer and
``padding="max_length", max_length=1024``; real rows have p99 ~220 tokens. With hidden 64 the
attention's quadratic term is as large as the weights' work at 1024, so the saving of a shorter
``max_length`` lies well above the token ratio: the doctor must size it from the model's shape
(the workload model), not guess between linear and quadratic. Plain PyTorch loop, AdamW.

Apply the fix through the probe's own flag: ``--max-length N``.

Ground truth: ``pad_fraction``, ``p99_length``, ``max_length`` (the padded width) over the
training batches; ``step_times_s``: each optimizer step's seconds (for steady-state steps/s);
``step_cpu_s``: each step's CPU seconds (the work itself, on a machine others share).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROBE = "narrow_padding"


class Rows(Dataset):
    def __init__(self, enc):
        self.enc = enc

    def __len__(self):
        return self.enc["input_ids"].shape[0]

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.enc.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="optimizer steps (default 12)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=1024, help="fixed padded length (default 1024)")
    p.add_argument("--examples", type=int, default=400, help="examples in the dataset")
    p.add_argument("--median-words", type=float, default=32, help="median words per example (p99 ~220 tokens)")
    p.add_argument("--n-embd", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "padding_waste", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tokenizer = C.get_hf_tokenizer(seed=args.seed)
    texts = C.make_corpus(args.examples, seed=args.seed + 2, median_words=args.median_words, sigma=0.5)
    with truth.timed("tokenize_s"):
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=args.max_length,
                        return_tensors="pt")
    enc["labels"] = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    loader = DataLoader(Rows(dict(enc)), batch_size=args.batch_size, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = C.TinyCausalLM(len(tokenizer), n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                           n_positions=max(1024, args.max_length))
    model.to(args.device)
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()

    cpu = [time.process_time()]  # CPU seconds per step: the work, whatever else shares the cores
    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps, device=args.device,
                         on_step=lambda step, t: cpu.append(time.process_time()))
    truth.write(**pads.fields(), step_times_s=list(truth.step_times),
                step_cpu_s=[b - a for a, b in zip(cpu, cpu[1:], strict=False)], final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
