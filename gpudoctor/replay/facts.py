"""What a replay can learn about a real run: from its recording, or from a Trainer checkpoint's files.

:func:`from_run` reads a folder that ``gpudoctor run`` (or ``attach``) recorded: the batches'
real lengths and padded widths, where the tokenizer was called (before the first step or
while training, per batch row), the Trainer's arguments and plan, the DataLoader's settings,
precision and the model's config (the hooks' ``model`` event). :func:`add_files` adds what a
checkpoint folder holds: ``TrainingArguments.to_json_string()`` output and the model's
``config.json``. :mod:`gpudoctor.replay.derive` turns these facts into a replay config.

A Trainer's ``training_args.bin`` is a pickle: loading it runs code its author chose, so it
is never loaded here (this may run as root on someone else's file); the error says how to
get the JSON form instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common import batchlengths, safefs
from gpudoctor.common.errors import UserError
from gpudoctor.recording.records import Records
from gpudoctor.recording.store import load_recording

MAX_JSON_BYTES = 4 * 2**20  # a config.json or training_args.json is a few kB


@dataclass
class Batch:
    seq_len: int
    lengths: list[int]  # a sample of at most 1,024 rows (common/batchlengths.py)
    pad: int
    rows: int  # exact
    longest: int  # exact


@dataclass
class RunFacts:
    """Each field ``None``/empty when its source did not say; ``origin`` names the sources."""

    origin: list[str] = field(default_factory=list)
    recorded: bool = False  # from a run folder: absent batches or tokenizer calls mean none happened
    training_args: dict[str, Any] | None = None
    args_source: str = ""
    plan_max_steps: int | None = None
    model_config: dict[str, Any] | None = None
    model_params: int | None = None
    model_class: str | None = None
    model_source: str = ""
    batches: list[Batch] = field(default_factory=list)
    tokenize_calls_startup: int = 0  # main process, before the first step
    tokenize_calls_training: int = 0  # after it, or in a DataLoader worker
    map_at_startup: bool = False  # datasets.map/filter before the first step
    loader: dict[str, Any] | None = None
    world_size: int = 1
    steps: int = 0
    checkpoints: int = 0
    autocast_dtype: str | None = None
    param_dtype: str | None = None

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)


def from_run(folder: Path) -> RunFacts:
    """The facts a recorded run folder holds; a folder without a recording is a one-line error."""
    rec = load_recording(folder)
    if not rec.events:
        raise UserError(f"{folder} holds no in-process events (was it recorded by 'gpudoctor run'?); "
                        "nothing to build a replay from: pass a replay config YAML instead")
    facts = RunFacts(origin=[f"the run recorded in {folder}"], recorded=True)
    workers = {pid for pid, r in rec.events.items() if r.proc is not None and r.proc.get("is_worker")}
    for pid, records in rec.events.items():
        first, loop = records.first_step, records.loop
        if loop and pid not in workers:
            facts.steps = max(facts.steps, len(loop.steps))
            facts.checkpoints = max(facts.checkpoints, len(loop.spans.get("checkpoint", [])))
            maps = loop.spans.get("format", [])
            facts.map_at_startup |= bool(maps) and (first is None or min(s for s, _ in maps) < first)
        _take(facts, records, pid in workers)
    return facts


def _take(facts: RunFacts, r: Records, worker: bool) -> None:
    """One process's records into the facts (the first process to say a setting gives it)."""
    facts.batches += [Batch(e["seq_len"], list(lengths), e["pad"], batchlengths.rows(e), batchlengths.longest(e) or 0)
                      for e in r.batches if (lengths := e.get("lengths"))]
    for c in r.counters:
        if c.name != "tokenize":
            continue
        if worker or (r.first_step is not None and c.t > r.first_step):
            facts.tokenize_calls_training += c.calls
        else:
            facts.tokenize_calls_startup += c.calls
    if r.trainer is not None and "args" in r.trainer and facts.training_args is None:
        facts.training_args, facts.args_source = r.trainer["args"], "the recorded TrainingArguments"
    if r.plan is not None and isinstance(max_steps := r.plan.get("max_steps"), int):
        facts.plan_max_steps = max_steps
    if r.model is not None and facts.model_config is None and r.model["config"]:  # a plain nn.Module: shape only
        facts.model_config = r.model["config"]
        facts.model_params = r.model.get("params")
        facts.model_class = r.model.get("class")
        facts.model_source = "the recorded model config"
    if r.loaders and not worker and facts.loader is None:
        facts.loader = dict(r.loaders[0])
    if r.proc is not None and isinstance(world := r.proc.get("world_size"), int) and world > 1:
        facts.world_size = world
    if r.torch_cfg is not None and facts.param_dtype is None:
        facts.autocast_dtype, facts.param_dtype = r.torch_cfg.get("autocast_dtype"), r.torch_cfg.get("param_dtype")


def add_files(facts: RunFacts, training_args: Path | None, model_config: Path | None) -> RunFacts:
    """Add (over the recording's) what a checkpoint's JSON files say."""
    if training_args is not None:
        args = read_json(training_args, "--training-args")
        if "per_device_train_batch_size" not in args:
            raise UserError(f"{training_args} has no per_device_train_batch_size: it is not "
                            "TrainingArguments.to_json_string() output; pass that file to --training-args")
        facts.training_args, facts.args_source = args, f"--training-args {training_args.name}"
        facts.origin.append(str(training_args))
    if model_config is not None:
        config = read_json(model_config, "--model-config")
        if not isinstance(config.get("model_type"), str):
            raise UserError(f"{model_config} has no model_type: it is not a model's config.json; "
                            "pass the config.json saved beside the weights to --model-config")
        facts.model_config = config
        facts.model_params = count_params(config)
        facts.model_class = None
        facts.model_source = f"--model-config {model_config.name}"
        facts.origin.append(str(model_config))
    return facts


def read_json(path: Path, flag: str) -> dict[str, Any]:
    """A small JSON object the user named; a pickle (.bin) or anything else is a one-line error."""
    if path.suffix in (".bin", ".pkl", ".pt", ".pth"):
        raise UserError(
            f"{flag} {path}: a {path.suffix} file is a pickle, which gpudoctor never loads (loading one runs "
            "code from the file); pass the JSON form: for training_args.bin, run in your own environment "
            "python -c \"import torch; print(torch.load('training_args.bin', weights_only=False)"
            ".to_json_string())\" > training_args.json; for a model, its config.json")
    try:  # the user named it: a link is followed, a FIFO or device refused, never waited on
        raw = safefs.read_bytes(os.path.realpath(path), limit=MAX_JSON_BYTES)
        data = json.loads(raw)
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"{flag} {path}: not a readable JSON file ({exc.__class__.__name__}); "
                        "pass the JSON the Trainer or save_pretrained wrote") from None
    if not isinstance(data, dict):
        raise UserError(f"{flag} {path}: holds {type(data).__name__}, not a JSON object")
    return data


def count_params(config: dict[str, Any]) -> int | None:
    """The parameter count of the model ``config.json`` describes, built on the meta device
    (no memory, no weights); None when the installed transformers cannot build it."""
    try:  # heavy and optional ([hf] extra): only for --model-config
        import torch
        from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForMaskedLM
    except ImportError:
        return None
    try:
        cfg = CONFIG_MAPPING[config["model_type"]].from_dict(config)
        archs = config.get("architectures") or []
        auto = AutoModelForMaskedLM if any(str(a).endswith("MaskedLM") for a in archs) else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto.from_config(cfg)  # type: ignore[no-untyped-call]  # transformers: unannotated
        return int(sum(p.numel() for p in model.parameters()))
    except Exception:  # an architecture this transformers does not know, or a config it refuses
        return None
