"""Probe: tokenization inside Dataset.__getitem__ (planted: tokenization_in_loop).

A map-style Dataset holds long raw documents and tokenizes each one with the Hugging Face
fast tokenizer in ``__getitem__`` (then truncates to a short ``max_length``), served by a
``DataLoader(num_workers=0)``: the training loop blocks on tokenization every step, so the
tokenizer dominates wall time and shows up as a data stall as well. Plain PyTorch loop,
AdamW, tiny causal LM.

Ground truth: ``tokenize_s`` = time inside the tokenizer call in ``__getitem__``;
``data_wait_s`` = time blocked in ``next(loader_iter)`` (includes tokenize_s and collation).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROBE = "tokenize_in_getitem"


class RawTextDataset(Dataset):
    def __init__(self, texts, tokenizer, max_length, truth):
        self.texts = texts
        self.tok = tokenizer
        self.max_length = max_length
        self.truth = truth

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        t = time.perf_counter()
        enc = self.tok(self.texts[i], truncation=True, max_length=self.max_length)
        self.truth.add("tokenize_s", time.perf_counter() - t)
        return enc["input_ids"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120, help="optimizer steps (default 120)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=32, help="truncation length (default 32)")
    p.add_argument("--docs", type=int, default=64, help="raw documents in the dataset")
    p.add_argument("--doc-words", type=float, default=6000, help="median words per document")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader workers (default 0: the planted waste; >0 moves the "
                        "tokenization off the main process, and out of tokenize_s)")
    p.add_argument("--pretokenize", action="store_true",
                   help="tokenize every document once before the loop (the fix; its time goes to startup)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--wait-for-attach", type=float, default=0.0, metavar="S",
                   help="before the first step, wait up to S seconds for gpudoctor attach's hooks (startup)")
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "tokenization_in_loop", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tokenizer = C.get_hf_tokenizer(seed=args.seed)
    texts = C.make_corpus(args.docs, seed=args.seed + 1, median_words=args.doc_words, sigma=0.3)
    ds = RawTextDataset(texts, tokenizer, args.max_length, truth)
    if args.pretokenize:
        ds = [ds[i] for i in range(len(ds))]  # a list is a map-style dataset
    pad = tokenizer.pad_token_id
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        collate_fn=functools.partial(C.collate_ids, pad=pad),
                        generator=torch.Generator().manual_seed(args.seed))

    model = C.TinyCausalLM(len(tokenizer))
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()

    C.wait_for_attach(args.wait_for_attach)
    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps)

    truth.write(**pads.fields(), truncation_length=args.max_length,
                final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
