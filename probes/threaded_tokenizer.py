"""Probe: a tokenizer with a thread pool in ``__getitem__`` (planted: tokenization_in_loop).

Each item is a document split into paragraphs, tokenized in one call of the Hugging Face fast
tokenizer on the list (``encode_batch``: the Rust thread pool uses every core in the training
process). With ``num_workers=0`` the loop waits for it every step. One forked worker is *slower*
here: ``tokenizers`` turns its pool off after a fork, so the worker builds on one thread what the
main process built on all cores. Pre-tokenizing (``--pretokenize``, once before the loop) removes
the tokenizer from the loop.

Ground truth: ``tokenize_s`` (inside tokenizer calls in this process, the pre-tokenizing
included), ``data_wait_s``, ``steady_steps_per_s``.
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

PROBE = "threaded_tokenizer"


class ParagraphDataset(Dataset):
    def __init__(self, docs: list[list[str]], tokenizer, max_length: int, truth, pretokenize: bool) -> None:
        self.docs = docs
        self.tok = tokenizer
        self.max_length = max_length
        self.truth = truth
        self.ready = [self._encode(d) for d in docs] if pretokenize else None

    def _encode(self, paragraphs: list[str]) -> list[int]:
        t = time.perf_counter()
        enc = self.tok(paragraphs, truncation=True, max_length=self.max_length)  # a batch: the thread pool
        self.truth.add("tokenize_s", time.perf_counter() - t)
        ids = [i for row in enc["input_ids"] for i in row]
        return ids[: self.max_length]

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> list[int]:
        return self.ready[i] if self.ready is not None else self._encode(self.docs[i])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--docs", type=int, default=120)
    p.add_argument("--paragraphs", type=int, default=16, help="paragraphs per document (one batch call)")
    p.add_argument("--paragraph-words", type=float, default=120)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0: the planted waste)")
    p.add_argument("--pretokenize", action="store_true", help="tokenize every document once before the loop (the fix)")
    p.add_argument("--lr", type=float, default=3e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "tokenization_in_loop", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "compute_s")
    tokenizer = C.get_hf_tokenizer(seed=args.seed)
    texts = C.make_corpus(args.docs * args.paragraphs, seed=args.seed + 1, median_words=args.paragraph_words, sigma=0.3)
    docs = [texts[i * args.paragraphs:(i + 1) * args.paragraphs] for i in range(args.docs)]
    ds = ParagraphDataset(docs, tokenizer, args.max_length, truth, args.pretokenize)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        collate_fn=functools.partial(C.collate_ids, pad=tokenizer.pad_token_id),
                        persistent_workers=args.num_workers > 0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = C.TinyCausalLM(len(tokenizer))
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()
    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps)
    truth.write(**pads.fields(), num_workers=args.num_workers, pretokenize=args.pretokenize,
                final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
