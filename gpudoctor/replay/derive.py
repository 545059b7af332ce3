"""Turn what a real run left behind (:mod:`gpudoctor.replay.facts`) into a replay config.

Every value is set together with where it came from (the recorded batches, the recorded
TrainingArguments, the model's config, or a default because nothing recorded it), so the
``replay.yaml`` written for the user says it on each line and the replay report lists it.
The config is then loaded like a hand-written one, with the same checks.
"""

from __future__ import annotations

import json
import math
import statistics
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.replay.checks import ARCHS
from gpudoctor.replay.config import TrainingSection
from gpudoctor.replay.facts import RunFacts
from gpudoctor.replay.schema import field_value
from gpudoctor.replay.size import config_params

SECTIONS = ("dataset", "text", "tokenizer", "max_length", "padding", "loop", "model", "training",
            "hardware", "full_run", "replay")
# A model up to this size is replayed at its own shape on a CPU; a larger one at a tiny shape of
# its architecture, its real size kept for the prediction (model.params_b, n_layers, hidden_size).
FULL_SIZE_REPLAY_PARAMS = 50_000_000
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "n_layer", "n_embd", "n_head", "n_inner", "ffn_dim",
             "word_embed_proj_dim")
MAX_BPE_VOCAB = 8000  # what a BPE trained on the replay's 2,000 synthetic examples can learn
_TRAINING_TYPES = typing.get_type_hints(TrainingSection)
BATCHES = "the recorded batches"
TOKENIZER = "the recorded tokenizer calls"
DEFAULT = "a default (not recorded)"


@dataclass
class Derived:
    """A replay config as a mapping, with the source of each dotted key."""

    origin: str
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)  # dotted -> (source, detail)

    def put(self, dotted: str, value: Any, source: str, detail: str = "") -> None:
        self.values[dotted] = value
        self.sources[dotted] = (source, detail)

    def comment(self, dotted: str) -> str:
        source, detail = self.sources[dotted]
        return _one_line(f"{source}: {detail}" if detail else source)

    def yaml_text(self, command: str) -> str:
        """``replay.yaml``: the values by section, each with its source as a comment."""
        lines = [f"# Replay config derived by gpudoctor from {_one_line(self.origin)}.",
                 "# Each value says where it came from; edit any of them and run it again with:",
                 f"#   {_one_line(command)}"]
        for section in SECTIONS:
            keys = [k for k in self.values if k == section or k.startswith(section + ".")]
            if section in self.values:
                lines.append(f"{section}: {_flow(self.values[section])}  # {self.comment(section)}")
                continue
            if keys:
                lines.append(f"{section}:")
                lines += [f"  {k.split('.', 1)[1]}: {_flow(self.values[k])}  # {self.comment(k)}" for k in keys]
        return "\n".join(lines) + "\n"

    def notes(self) -> list[str]:
        """One line per source: which values it gave."""
        by_source: dict[str, list[str]] = defaultdict(list)
        for key, (source, _) in self.sources.items():
            by_source[source].append(f"{key} {_flow(self.values[key])}")
        return [_one_line(f"replay config, from {source}: {', '.join(items)}") for source, items in by_source.items()]


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _flow(value: Any) -> str:
    """A YAML flow value: JSON strings are valid YAML, mappings inline."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(float(f"{value:.6g}"))
    return json.dumps(value) if isinstance(value, str) else str(value)


def derive(facts: RunFacts, target: str | None = None) -> Derived:
    """The replay config the facts support; what they do not say is a default, said so."""
    d = Derived(origin=" and ".join(facts.origin) or "defaults")
    _input_side(d, facts)
    _model(d, facts)
    _training(d, facts)
    _dataset_size(d, facts)
    if target:
        d.put("hardware.target", target, "the command line (--target)")
    if facts.world_size > 1:
        d.put("hardware.gpus", facts.world_size, "the recorded ranks", "world size")
    return d


def _input_side(d: Derived, f: RunFacts) -> None:
    """Lengths, padding, max_length and where tokenizing happened, from the recorded batches."""
    d.put("dataset.kind", "synthetic", DEFAULT, "stands in for the real data (its lengths: dataset.length)")
    vocab = (f.model_config or {}).get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 300:
        d.put("tokenizer.train_bpe", {"vocab_size": min(vocab, MAX_BPE_VOCAB)},
              f.model_source, f"vocab_size {vocab}" + (f", capped at {MAX_BPE_VOCAB} (a BPE trained on "
                                                     "synthetic data learns no more)" if vocab > MAX_BPE_VOCAB else ""))
    if not f.recorded:
        _unrecorded_input_side(d, f)
        return
    tokenize_at = _tokenize_stage(f)
    d.put("text.format_at", "ahead", TOKENIZER, "formatting is timed with tokenizing (see tokenize_at)")
    d.put("tokenizer.tokenize_at", tokenize_at[0], TOKENIZER, tokenize_at[1])
    batches = [b for b in f.batches if b.lengths]
    if not batches:
        d.put("padding", "longest", DEFAULT, "no batch with an attention mask was recorded")
        return
    seen = f"{len(batches)} batches, {f.rows} rows"
    widths = {b.seq_len for b in batches}
    no_pad = all(b.pad == 0 for b in batches)
    if no_pad and len(widths) == 1 and tokenize_at[0] in ("ahead", "startup"):
        padding = "packing"
    elif len(widths) == 1 and any(b.longest < b.seq_len for b in batches):
        padding = "max_length"
    else:
        padding = "longest" if len(widths) > 1 or not no_pad else "max_length"
    d.put("padding", padding, BATCHES, seen)
    d.put("max_length", max(8, max(widths)),
          BATCHES, "the padded width" if padding != "longest" else "the widest batch")
    lengths = [x for b in batches for x in b.lengths if x > 0]
    if padding == "packing" or not lengths:
        return  # packed chunks say nothing of the examples' own lengths
    logs = [math.log(x) for x in lengths]
    spec: dict[str, Any] = {"mean": round(statistics.fmean(lengths), 1),
                            "sigma": round(statistics.pstdev(logs), 3) if len(logs) > 1 else 0.0,
                            "min": min(lengths), "max": max(b.longest for b in batches), "unit": "tokens"}
    if spec["min"] == spec["max"]:
        spec = {"mean": float(spec["min"]), "min": spec["min"], "max": spec["max"], "unit": "tokens",
                "dist": "fixed"}
    d.put("dataset.length", spec, BATCHES, f"real (unpadded) lengths of {f.rows} rows, lognormal fit")


def _unrecorded_input_side(d: Derived, f: RunFacts) -> None:
    """Checkpoint files say nothing of the data: the config's defaults, each said to be one."""
    why = "not in a checkpoint's files: replay a run recorded by gpudoctor run for the real ones"
    d.put("text.format_at", "ahead", DEFAULT, why)
    d.put("tokenizer.tokenize_at", "getitem", DEFAULT, "where your script tokenizes: ahead | startup | getitem | collate")
    positions = _int(f.model_config or {}, "max_position_embeddings", "n_positions")
    d.put("max_length", min(512, positions or 512), DEFAULT, "512, at most the model's positions")
    d.put("padding", "longest", DEFAULT, why)
    d.put("dataset.length", {"mean": 200.0, "sigma": 0.5, "unit": "tokens"}, DEFAULT, why)


def _tokenize_stage(f: RunFacts) -> tuple[str, str]:
    if f.tokenize_calls_training:
        rows = max(1, f.rows)
        per_row = f.tokenize_calls_training / rows
        stage = "getitem" if per_row >= 0.5 else "collate"
        return stage, (f"{f.tokenize_calls_training} tokenizer calls while training over {f.rows} recorded "
                       f"rows ({per_row:.2g} per row: {'per example' if stage == 'getitem' else 'per batch'})")
    if f.tokenize_calls_startup:
        how = "in datasets.map " if f.map_at_startup else ""
        n = f.tokenize_calls_startup
        return "startup", f"{n} tokenizer call{'s' if n != 1 else ''} {how}before the first step, none while training"
    return "ahead", "no tokenizer call recorded: the data came tokenized"


def _model(d: Derived, f: RunFacts) -> None:
    cfg = f.model_config
    if not cfg:
        d.put("model.arch", "gpt2", DEFAULT, "no model config was recorded (not a Hugging Face model); "
              "set model.params_b to the real size")
        return
    src = f.model_source
    model_type = str(cfg.get("model_type") or "")
    masked = (f.model_class or "").endswith("MaskedLM") or any(
        str(a).endswith("MaskedLM") for a in cfg.get("architectures") or [])
    arch = model_type if model_type in ARCHS else ("bert" if masked else "llama")
    d.put("model.arch", arch, src, "" if arch == model_type else
          f"{model_type!r} is not one the replay builds: replayed as {arch} of the same size")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    params = f.model_params
    if params:
        d.put("model.params_b", float(f"{params / 1e9:.4g}"), src, f"{params:,} parameters")
    if layers:
        d.put("model.n_layers", layers, src)
    if hidden:
        d.put("model.hidden_size", hidden, src)
    if arch == model_type and params and params <= FULL_SIZE_REPLAY_PARAMS:
        sizes = {k: cfg[k] for k in SIZE_KEYS if _is_int(cfg.get(k))}
        # The size the replay would build is the config's, whatever the recording's params say
        built = config_params(arch, sizes) if sizes else None
        if built is not None and built <= FULL_SIZE_REPLAY_PARAMS:
            d.put("model.config", sizes, src, "small enough to replay at its own shape")
            return
    d.put("model.config", {}, DEFAULT, f"the replay's tiny {arch} (2 layers x 64) runs here; the real size "
          "(params_b) is what is predicted")


def _training(d: Derived, f: RunFacts) -> None:
    args = f.training_args
    if args is not None:
        d.put("loop", "trainer", f.args_source)
        for key in _TRAINING_TYPES:
            value = _training_value(key, args, f)
            if value is not None:
                d.put(f"training.{key}", value, f.args_source)
        return
    d.put("loop", "plain", "the recording", "no Trainer was seen: a hand-written loop")
    loader = f.loader or {}
    for key, name in (("per_device_train_batch_size", "batch_size"), ("dataloader_num_workers", "num_workers"),
                      ("dataloader_pin_memory", "pin_memory"), ("dataloader_prefetch_factor", "prefetch_factor"),
                      ("dataloader_persistent_workers", "persistent_workers")):
        value = loader.get(name)
        if value is not None and (key != "dataloader_prefetch_factor" or loader.get("num_workers")):
            d.put(f"training.{key}", value, "the recorded DataLoader")
    if f.steps and len(f.batches) >= 2 * f.steps:
        d.put("training.gradient_accumulation_steps", round(len(f.batches) / f.steps), BATCHES,
              f"{len(f.batches)} batches over {f.steps} optimizer steps")
    if f.steps and f.checkpoints:
        d.put("training.save_steps", max(1, f.steps // f.checkpoints), "the recorded checkpoints",
              f"{f.checkpoints} over {f.steps} steps")
    dtype = f.autocast_dtype or f.param_dtype or ""
    if "bfloat16" in dtype or "float16" in dtype:
        key = "training.bf16" if "bfloat16" in dtype else "training.fp16"
        d.put(key, True, "the recorded precision", dtype)


def _training_value(key: str, args: dict[str, Any], f: RunFacts) -> Any:
    """The TrainingArguments value for ``key`` in the replay's terms, or None to leave the default."""
    value = args.get(key)
    if key == "save_steps":
        strategy = str(args.get("save_strategy") or "steps").lower().rsplit(".", 1)[-1]
        if strategy == "no":
            return None
        if strategy == "epoch" and f.plan_max_steps:
            return max(1, round(f.plan_max_steps / max(1.0, float(args.get("num_train_epochs") or 1))))
        if isinstance(value, float) and 0 < value < 1:  # a ratio of the total steps
            return max(1, round(value * f.plan_max_steps)) if f.plan_max_steps else None
    if isinstance(value, str) and _TRAINING_TYPES[key] is not str:
        return None  # TrainingArguments writes a number as a number
    try:  # typed and bounded as the config will be: e.g. logging_steps 0.1 (a ratio) keeps the default
        typed = field_value(TrainingSection, key, value, f.args_source, f"training.{key}")
    except UserError:
        return None
    return None if isinstance(typed, str) and not 0 < len(typed) < 100 else typed


def _dataset_size(d: Derived, f: RunFacts) -> None:
    """How many examples the real run trains on: the Trainer's plan, else what was seen."""
    tr = {k.split(".", 1)[1]: v for k, v in d.values.items() if k.startswith("training.")}
    per_step = (tr.get("per_device_train_batch_size") or 8) * (tr.get("gradient_accumulation_steps") or 1) * (
        f.world_size)
    max_steps = tr.get("max_steps") or -1
    epochs = float(tr.get("num_train_epochs") or 1.0)
    if max_steps > 0:
        count, source = max_steps * per_step, (f.args_source, f"max_steps {max_steps} x {per_step} examples per step")
        d.put("full_run.max_steps", max_steps, f.args_source)
    elif f.plan_max_steps:
        count = max(1, round(f.plan_max_steps / epochs)) * per_step
        source = ("the Trainer's plan", f"{f.plan_max_steps} steps over {epochs:g} epochs x {per_step} examples per step")
    elif f.rows:
        count, source = f.rows, (BATCHES, "the rows seen (the real dataset's size was not recorded: set dataset.count)")
    else:
        count, source = 10_000, (DEFAULT, "set dataset.count to the real dataset's size")
    d.put("dataset.count", int(count), *source)
    d.put("replay.examples", min(int(count), 2000), DEFAULT, "the replay's 2000, at most the dataset")


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    return next((cfg[k] for k in keys if _is_int(cfg.get(k)) and cfg[k] > 0), None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

