"""Probe: Hugging Face Trainer with fixed max_length padding (planted: padding_waste).

A tiny ``GPT2LMHeadModel`` (random weights, from a config) trained with ``Trainer`` on CPU
(``use_cpu=True``, ``report_to=[]``) over a ``datasets.Dataset`` pre-tokenized with
``padding="max_length", max_length=512`` while the data's p99 is ~140 tokens (~90% of the
tokens are padding). Checkpoints every ``--save-steps`` steps (visible but secondary).

Ground truth (measured by the probe itself, not by a TrainerCallback, because callbacks
only see the edges of steps and saves): the probe wraps two methods of its own Trainer
instance:
- ``trainer.get_batch_samples`` (the Trainer's ``next()`` on the training DataLoader):
  its first call marks ``startup_s``; the time inside it is ``data_wait_s``; the batches
  it returns give ``pad_fraction`` / ``p99_length`` / ``max_length`` (attention masks);
  the intervals between its calls are the step times.
- ``trainer._save_checkpoint`` (model, optimizer, scheduler, RNG and trainer state):
  the time inside it is ``checkpoint_s``.
``train_s`` is the time inside ``trainer.train()``; ``tokenize_s`` the batched
``Dataset.map`` tokenization before training; ``padding_waste_share_est`` =
(train_s - data_wait_s - checkpoint_s) / wall_s x pad_fraction (a linear estimate).
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

PROBE = "hf_trainer"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="max_steps (default 20)")
    p.add_argument("--save-steps", type=int, default=5, help="save_steps (default 5)")
    p.add_argument("--batch-size", type=int, default=2, help="per_device_train_batch_size (default 2)")
    p.add_argument("--max-length", type=int, default=512, help="fixed padded length (default 512)")
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--median-words", type=float, default=20, help="median words per example")
    p.add_argument("--output-dir", default=None, help="Trainer output_dir (default: temp, removed)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--final-save", action="store_true",
                   help="trainer.save_model() after training, like run_clm (model + training_args.bin)")
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)
    truth = C.Truth(PROBE, "padding_waste", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s")

    import datasets
    import transformers
    from transformers import Trainer, TrainingArguments, default_data_collator
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    truth.fields["imports_s"] = truth.now()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tokenizer = C.get_hf_tokenizer(seed=args.seed)
    texts = C.make_corpus(args.examples, seed=args.seed + 6, median_words=args.median_words,
                          sigma=0.5)
    raw = datasets.Dataset.from_dict({"text": texts})

    def tokenize(batch):
        enc = tokenizer(batch["text"], padding="max_length", truncation=True,
                        max_length=args.max_length)
        enc["labels"] = [[t if m else -100 for t, m in zip(ids, mask, strict=True)]
                         for ids, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
        return enc

    with truth.timed("tokenize_s"):
        train_ds = raw.map(tokenize, batched=True, remove_columns=["text"])

    model = C.build_gpt2(len(tokenizer), n_positions=max(1024, args.max_length),
                         pad_token_id=tokenizer.pad_token_id)
    own_dir = args.output_dir is None
    out_dir = tempfile.mkdtemp(prefix="gpudoctor-probe-trainer-") if own_dir else args.output_dir
    targs = TrainingArguments(
        output_dir=out_dir,
        use_cpu=True,
        report_to=[],
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_steps=10_000,
        disable_tqdm=True,
        log_level="error",
        dataloader_num_workers=0,
        seed=args.seed,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds,
                      data_collator=default_data_collator)
    trainer.remove_callback(PrinterCallback)  # keep stdout quiet
    trainer.remove_callback(ProgressCallback)

    pads = C.PadCounter()
    def count_padding(batches):
        for b in batches:
            if isinstance(b, dict) and "attention_mask" in b:
                pads.add(b["attention_mask"])

    result, train_s = C.train_trainer_timed(trainer, truth, count_padding)

    if args.final_save:  # outside train(): its own field, not checkpoint_s
        t = time.perf_counter()
        trainer.save_model()
        truth.fields.update(final_saves=1, final_save_s=time.perf_counter() - t)
    if own_dir:
        shutil.rmtree(out_dir, ignore_errors=True)
    f = pads.fields()
    compute_s = train_s - truth.timers["data_wait_s"] - truth.timers["checkpoint_s"]
    wall_now = truth.now()
    truth.write(**f, train_s=train_s, compute_s=compute_s,
                padding_waste_share_est=compute_s / wall_now * (f["pad_fraction"] or 0.0),
                save_steps=args.save_steps, global_step=trainer.state.global_step,
                final_loss=float(result.training_loss))


if __name__ == "__main__":
    main()
