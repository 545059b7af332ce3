"""Probe: slow dataset formatting before the first step (planted: startup_idle).

Like the user's case in docs/seeds/000: the script builds a ``datasets.Dataset`` of
~100k instruction/response examples and formats it with a non-batched
``.map(format_fn)`` (the slow way) inside the training script, before training starts;
then a short, healthy training loop (pre-tokenized, length-bucketed dynamic padding, no
checkpoints). Caching is disabled (``datasets.disable_caching()``, a temporary
``HF_DATASETS_CACHE``) so the map really runs every time.

Ground truth: ``startup_s`` = process creation -> just before the first ``next()`` on the
training DataLoader; ``format_s`` = time inside ``Dataset.map(format_fn)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_TMP = tempfile.TemporaryDirectory(prefix="gpudoctor-probe-datasets-")
os.environ["HF_DATASETS_CACHE"] = _TMP.name  # before datasets is imported

import _common as C  # noqa: E402
import datasets  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

PROBE = "slow_startup"


def format_fn(example):
    """Turn one raw record into a prompt string (called once per example)."""
    return {
        "text": (
            "### Instruction:\n" + example["instruction"].strip()
            + "\n\n### Input:\n" + (example["context"].strip() or "(none)")
            + "\n\n### Response:\n" + example["response"].strip()
        )
    }


def bucketed_batches(lengths, batch_size, seed):
    """Sort by length, cut into batches, shuffle batch order: minimal padding."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    g = torch.Generator().manual_seed(seed)
    return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=100_000,
                   help="examples formatted by the slow map (default 100000)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=128, help="truncation length (default 128)")
    p.add_argument("--lr", type=float, default=3e-4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "startup_idle", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "format_s", "compute_s")
    datasets.disable_caching()
    datasets.disable_progress_bars()

    # "load" the raw dataset: records combined from a small synthetic corpus
    pool = C.make_corpus(1500, seed=args.seed + 4, median_words=12, sigma=0.6)
    n, m = args.examples, len(pool)
    raw = datasets.Dataset.from_dict({
        "instruction": [pool[i % m] for i in range(n)],
        "context": [pool[(i * 7 + 3) % m] if i % 3 == 0 else "" for i in range(n)],
        "response": [pool[(i * 13 + 5) % m] for i in range(n)],
    })

    t = time.perf_counter()
    formatted = raw.map(format_fn, remove_columns=raw.column_names)  # non-batched: slow
    truth.add("format_s", time.perf_counter() - t)

    tok = C.get_tokenizer(seed=args.seed)
    tok.enable_truncation(args.max_length)
    n_train = min(len(formatted), args.steps * args.batch_size)
    texts = formatted.select(range(n_train))["text"]
    with truth.timed("tokenize_s"):
        seqs = [e.ids for e in tok.encode_batch(texts)]
    batches = bucketed_batches([len(s) for s in seqs], args.batch_size, args.seed)
    pad = C.pad_id(tok)
    loader = DataLoader(batches, batch_size=None, shuffle=False, num_workers=0,
                        collate_fn=lambda idx: C.collate_ids([seqs[i] for i in idx], pad))

    model = C.TinyCausalLM(tok.get_vocab_size())
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()

    truth.mark_train_start()
    loss = C.train_timed(model, loader, opt, truth, pads, done=lambda step: step >= args.steps)

    truth.write(**pads.fields(), examples_formatted=len(formatted),
                final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
