"""Build what the config describes: the startup work, the Dataset, the collate
function, the loop's own work, the DataLoader and a random-weight model.

Nothing here imports gpudoctor's hooks: the worker is profiled from outside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from gpudoctor.replay.checks import MASKED_ARCHS
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.data import Collator, LoopWork, ReplayDataset, Stages, TextOps, pack
from gpudoctor.replay.size import tiny_defaults

Batch = dict[str, list[Any]]

@dataclass
class Pipeline:
    """The input side of the run, and what building it at startup cost."""

    dataset: ReplayDataset
    collator: Collator
    loop_work: LoopWork | None
    ops: TextOps
    stages: Stages
    startup_s: dict[str, float] = field(default_factory=dict)
    startup_examples: int = 0


def is_causal(cfg: ReplayConfig, model: Any | None = None) -> bool:
    if model is not None:
        return not type(model).__name__.endswith("MaskedLM")
    return cfg.model.path is not None or cfg.model.arch not in MASKED_ARCHS


def build_pipeline(cfg: ReplayConfig, data: Any, tokenizer: Any) -> Pipeline:
    """Run the ``startup`` stages with ``datasets.map`` (as a training script would),
    then wrap the rest into the Dataset, collate function and loop work."""
    stages = Stages(cfg.text.format_at, cfg.tokenizer.tokenize_at)
    ops = TextOps(
        cfg.text.template, cfg.text.field, tokenizer, cfg.max_length, cfg.padding, is_causal(cfg)
    )
    timings: dict[str, float] = {}
    n = len(data)
    if stages.fmt == "startup":
        t0 = time.perf_counter()
        data = data.map(lambda row: {"text": ops.format(row)}, remove_columns=data.column_names)
        timings["format_s"] = time.perf_counter() - t0
    if stages.tok == "startup":
        t0 = time.perf_counter()
        data = data.map(
            _tokenize_batch(ops, cfg.padding), batched=True, remove_columns=data.column_names
        )
        timings["tokenize_s"] = time.perf_counter() - t0
    loop_work = LoopWork(ops, stages) if "loop" in (stages.fmt, stages.tok) else None
    return Pipeline(
        ReplayDataset(data, ops, stages, cfg.replay.read_latency_ms / 1000),
        Collator(ops, stages),
        loop_work,
        ops,
        stages,
        timings,
        n,
    )


def _tokenize_batch(ops: TextOps, padding: str) -> Callable[[Batch], Batch]:
    tok = ops.tokenizer

    def run(batch: Batch) -> Batch:
        if padding == "packing":
            ids = tok(batch["text"], add_special_tokens=False)["input_ids"]
            return {"input_ids": pack(ids, ops.max_length, int(tok.eos_token_id))}
        return {
            "input_ids": tok(batch["text"], truncation=True, max_length=ops.max_length)["input_ids"]
        }

    return run


def build_loader(cfg: ReplayConfig, pipe: Pipeline, pin_memory: bool) -> DataLoader[Any]:
    """A DataLoader with the config's batch, worker, pin, prefetch and persistence settings."""
    tr = cfg.training
    workers = tr.dataloader_num_workers
    return DataLoader(
        pipe.dataset,
        batch_size=tr.per_device_train_batch_size,
        shuffle=True,
        num_workers=workers,
        collate_fn=pipe.collator,
        pin_memory=pin_memory,
        drop_last=tr.dataloader_drop_last,
        prefetch_factor=tr.dataloader_prefetch_factor if workers > 0 else None,
        persistent_workers=tr.dataloader_persistent_workers if workers > 0 else False,
        generator=torch.Generator().manual_seed(tr.seed),
    )


def model_config(cfg: ReplayConfig, tokenizer: Any) -> Any:
    """The transformers config: ``model.path``'s config.json, or ``arch`` with ``model.config``."""
    from transformers import AutoConfig

    if cfg.model.path:
        config = AutoConfig.from_pretrained(str(cfg.resolve(cfg.model.path)), local_files_only=True)
    else:
        arch = cfg.model.arch
        overrides = {**tiny_defaults(arch, cfg.model.config), **cfg.model.config}
        try:
            config = AutoConfig.for_model(arch, **overrides)
        except (TypeError, ValueError) as exc:
            raise cfg.error("model.config", f"{arch} does not accept it: {exc}") from None
        _fit_head_dim(config, overrides)
    config.vocab_size = len(tokenizer)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        if hasattr(config, key):
            setattr(
                config,
                key,
                tokenizer.pad_token_id if key == "pad_token_id" else tokenizer.eos_token_id,
            )
    needed = cfg.max_length + 2  # roberta reserves two position slots
    for key in ("n_positions", "max_position_embeddings"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) < needed:
            setattr(config, key, needed)
    return config


def _fit_head_dim(config: Any, overrides: dict[str, Any]) -> None:
    """Some archs (qwen3, gemma) default head_dim to 128/256 whatever the width is."""
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if "head_dim" not in overrides and hasattr(config, "head_dim") and heads and hidden:
        config.head_dim = hidden // heads


def build_model(cfg: ReplayConfig, tokenizer: Any) -> Any:
    """A random-weight model of the configured architecture and size (never downloads)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config = model_config(cfg, tokenizer)
    torch.manual_seed(cfg.training.seed)
    auto = AutoModelForCausalLM if is_causal(cfg) else AutoModelForMaskedLM
    try:
        model = auto.from_config(config)  # type: ignore[no-untyped-call]  # transformers: unannotated
    except ValueError as exc:
        raise cfg.error("model.arch", f"cannot build a {auto.__name__} from it: {exc}") from None
    if cfg.training.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model
