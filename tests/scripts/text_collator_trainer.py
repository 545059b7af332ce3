"""A real Hugging Face Trainer run on the CPU whose batches are mostly padding.

``--raw-text``: the dataset's items are ``{"text": ...}`` and a custom collator tokenizes them
(no ``input_ids`` in the items: the Trainer's ``group_by_length`` sampler cannot size them).
Without it, the items are tokenized up front (``input_ids`` in each). ``--steps`` (default 4);
``--train_sampling_strategy`` passes through to ``TrainingArguments`` (``gpudoctor try`` sets it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "probes"))

# Rows of about 20 tokens padded to 256: a loaded machine's noisy timing of the widths after the run
# still finds the padding (at 64 wide, once in two runs beside another test worker, it did not).
MAX_LENGTH = 256


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--raw-text", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="trainer-out")
    p.add_argument("--train_sampling_strategy", default="random")
    a = p.parse_args()
    import torch
    from _common import build_gpt2, get_hf_tokenizer
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    torch.set_num_threads(1)
    tok = get_hf_tokenizer()
    texts = [f"sample number {i} " * (1 + i % 5) for i in range(64)]

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:  # text in, padded tensors out
        batch = dict(tok([it["text"] for it in items], padding="max_length", truncation=True, max_length=MAX_LENGTH,
                         return_tensors="pt"))
        batch["labels"] = batch["input_ids"].clone()
        return batch

    ds = Dataset.from_dict({"text": texts})
    if not a.raw_text:
        ds = ds.map(lambda b: tok(b["text"], padding="max_length", truncation=True, max_length=MAX_LENGTH),
                    batched=True, remove_columns=["text"])
        ds = ds.map(lambda b: {"labels": b["input_ids"]}, batched=True)
    args = TrainingArguments(output_dir=a.out, per_device_train_batch_size=8, max_steps=a.steps,
                             save_strategy="no", use_cpu=True, report_to=[], logging_steps=100,
                             disable_tqdm=True, remove_unused_columns=not a.raw_text,
                             train_sampling_strategy=a.train_sampling_strategy)
    Trainer(model=build_gpt2(vocab_size=len(tok)), args=args, train_dataset=ds,
            data_collator=collate if a.raw_text else None).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
