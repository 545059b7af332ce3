"""Probe: every batch padded to a fixed max_length far above the data (planted: padding_waste).

The corpus is tokenized once, before the loop, with the Hugging Face fast tokenizer and
``padding="max_length", max_length=512`` while the data's p99 is ~140 tokens, so ~90% of
the tokens the model computes on are padding. Loading is cheap (in-memory tensors, default
collate), so the padded compute is the dominant waste. Plain PyTorch loop, AdamW.

Ground truth: ``pad_fraction`` = pad tokens / all tokens over the training batches (from the
attention masks), ``p99_length`` = p99 of the real lengths in those batches,
``max_length`` = the padded length (512); ``compute_s`` = forward + backward + optimizer
time; ``padding_waste_share_est`` = compute_share x pad_fraction (a linear estimate).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROBE = "fixed_padding"


class EncodedDataset(Dataset):
    def __init__(self, enc):
        self.enc = enc

    def __len__(self):
        return self.enc["input_ids"].shape[0]

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.enc.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=45, help="optimizer steps (default 45)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=512, help="fixed padded length (default 512)")
    p.add_argument("--examples", type=int, default=800, help="examples in the dataset")
    p.add_argument("--median-words", type=float, default=20, help="median words per example")
    p.add_argument("--lr", type=float, default=3e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "padding_waste", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tokenizer = C.get_hf_tokenizer(seed=args.seed)
    texts = C.make_corpus(args.examples, seed=args.seed + 2, median_words=args.median_words,
                          sigma=0.5)
    with truth.timed("tokenize_s"):
        enc = tokenizer(texts, padding="max_length", truncation=True,
                        max_length=args.max_length, return_tensors="pt")
    enc["labels"] = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    data_lengths = enc["attention_mask"].sum(-1).tolist()

    loader = DataLoader(EncodedDataset(dict(enc)), batch_size=args.batch_size, shuffle=True,
                        num_workers=0, generator=torch.Generator().manual_seed(args.seed))
    model = C.TinyCausalLM(len(tokenizer), n_positions=max(1024, args.max_length))
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()

    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps)

    f = pads.fields()
    share = truth.timers["compute_s"] / truth.now()
    truth.write(**f, data_p99_length=C.percentile(data_lengths, 99),
                padding_waste_share_est=share * f["pad_fraction"],
                final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
