"""Probe: a run_clm.py-like script (planted: checkpoint_overhead through its own --save_steps).

Mirrors Hugging Face's examples/pytorch/language-modeling/run_clm.py: ``ModelArguments`` and
``DataTrainingArguments`` dataclasses plus ``TrainingArguments``, parsed by ``HfArgumentParser``
(or from one JSON file); a GPT-2 built from a config (``--config_overrides``) with random
weights; the corpus tokenized with ``datasets.map`` (``--preprocessing_num_workers``), then
concatenated and cut into ``--block_size`` blocks by ``group_texts``; ``Trainer`` on CPU
(``use_cpu``, ``report_to`` none). Offline: a locally built tokenizer and a synthetic corpus
stand in for ``--dataset_name`` and ``--tokenizer_name``.

Planted: ``--save_steps 1`` (the probe's default too) with a model large enough that each
checkpoint (weights, optimizer, scheduler, RNG, trainer state) outweighs a step, so
``checkpoint_overhead`` is the top finding, and its fix is this script's own ``--save_steps``.

Ground truth, measured as ``hf_trainer`` does, by wrapping two methods of its own Trainer:
``get_batch_samples`` (first call: ``startup_s``; time inside: ``data_wait_s``) and
``_save_checkpoint`` (time inside: ``checkpoint_s``, calls: ``checkpoints``). ``tokenize_s``
is the tokenizing map, ``format_s`` the group_texts map.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

PROBE = "run_clm_like"

# What a bare ``python probes/run_clm_like.py`` runs with: the planted configuration.
PROBE_DEFAULTS = {
    "max_steps": 40,
    "per_device_train_batch_size": 1,
    "save_steps": 1,
    "save_total_limit": 2,
    "learning_rate": 3e-4,
    "logging_steps": 10_000,
    "disable_tqdm": True,
    "log_level": "error",
    "use_cpu": True,
    "seed": 0,
}


@dataclass
class ModelArguments:
    model_type: str = field(default="gpt2", metadata={"help": "model type trained from scratch"})
    config_overrides: Optional[str] = field(  # noqa: UP045 - HfArgumentParser reads the annotation
        default="n_embd=384,n_layer=6,n_head=6",
        metadata={"help": "override config attributes, e.g. n_embd=64,n_layer=2"},
    )
    vocab_size: int = field(default=2000, metadata={"help": "size of the locally trained BPE"})


@dataclass
class DataTrainingArguments:
    train_examples: int = field(default=2000, metadata={"help": "synthetic documents (for --dataset_name)"})
    median_words: float = field(default=60.0, metadata={"help": "median words per document"})
    max_train_samples: Optional[int] = field(default=None)  # noqa: UP045
    block_size: Optional[int] = field(  # noqa: UP045
        default=32, metadata={"help": "tokens per training block after grouping"})
    preprocessing_num_workers: Optional[int] = field(  # noqa: UP045
        default=None, metadata={"help": "processes for the tokenizing and grouping maps"})
    overwrite_cache: bool = field(default=False)


@dataclass
class ProbeArguments:
    truth: Optional[str] = field(  # noqa: UP045
        default=None, metadata={"help": "write the ground-truth JSON here (or $GPUDOCTOR_PROBE_TRUTH)"})
    threads: int = field(default=1, metadata={"help": "torch intra-op threads"})


def main() -> None:
    from transformers import (
        CONFIG_MAPPING,
        AutoModelForCausalLM,
        HfArgumentParser,
        Trainer,
        TrainingArguments,
        default_data_collator,
    )

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments, ProbeArguments))
    parser.set_defaults(**PROBE_DEFAULTS)
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args, probe_args = parser.parse_json_file(os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args, probe_args = parser.parse_args_into_dataclasses()
    probe_args.seed = training_args.seed
    C.setup(probe_args)
    truth = C.Truth(PROBE, "checkpoint_overhead", C.truth_path(probe_args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "format_s")

    import datasets
    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    truth.fields["imports_s"] = truth.now()
    datasets.disable_progress_bars()
    datasets.disable_caching()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    tokenizer = C.get_hf_tokenizer(vocab_size=model_args.vocab_size, seed=training_args.seed)
    texts = C.make_corpus(data_args.train_examples, seed=training_args.seed + 11,
                          median_words=data_args.median_words, sigma=0.6)
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})})
    if data_args.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(len(texts), data_args.max_train_samples)))

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    with truth.timed("tokenize_s"):
        tokenized = raw.map(tokenize_function, batched=True, num_proc=data_args.preprocessing_num_workers,
                            remove_columns=["text"], load_from_cache_file=not data_args.overwrite_cache)

    block_size = min(data_args.block_size or 1024, 1024)

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total = (len(concatenated["input_ids"]) // block_size) * block_size
        result = {k: [t[i: i + block_size] for i in range(0, total, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with truth.timed("format_s"):
        lm_datasets = tokenized.map(group_texts, batched=True, num_proc=data_args.preprocessing_num_workers,
                                    load_from_cache_file=not data_args.overwrite_cache)

    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.n_positions = max(block_size, 128)
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(config)

    own_dir = not training_args.output_dir or "--output_dir" not in " ".join(sys.argv)
    if own_dir:
        training_args.output_dir = tempfile.mkdtemp(prefix="gpudoctor-probe-clm-")
    training_args.report_to = []
    trainer = Trainer(model=model, args=training_args, train_dataset=lm_datasets["train"],
                      processing_class=tokenizer, data_collator=default_data_collator)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)

    result, train_s = C.train_trainer_timed(trainer, truth)
    if own_dir:
        shutil.rmtree(training_args.output_dir, ignore_errors=True)
    compute_s = train_s - truth.timers["data_wait_s"] - truth.timers["checkpoint_s"]
    truth.write(train_s=train_s, compute_s=compute_s, save_steps=training_args.save_steps,
                block_size=block_size, blocks=len(lm_datasets["train"]),
                global_step=trainer.state.global_step, final_loss=float(result.training_loss))


if __name__ == "__main__":
    main()
