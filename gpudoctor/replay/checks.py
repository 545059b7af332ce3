"""Cross-field checks of a loaded config: paths exist, stages are in order, nothing
would need a download. Each failure is one line naming the key and its line."""

from __future__ import annotations

import re
import string

from gpudoctor.common.errors import UserError
from gpudoctor.replay import gpus
from gpudoctor.replay.sections import ReplayConfig

# Architectures the replay can build from a config with random weights (offline).
CAUSAL_ARCHS = ("gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma", "gpt_neox", "opt", "phi3")
MASKED_ARCHS = ("bert", "roberta")
ARCHS = CAUSAL_ARCHS + MASKED_ARCHS

_HUBLIKE = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
STAGE_ORDER: tuple[str, ...] = ("ahead", "startup", "getitem", "collate", "loop")


def stage_index(stage: str) -> int:
    """Where a stage runs in the pipeline, earliest first."""
    return STAGE_ORDER.index(stage)


def check(cfg: ReplayConfig) -> None:
    """Raise ``UserError`` for the first problem found."""
    _check_dataset(cfg)
    _check_text(cfg)
    _check_stages(cfg)
    _check_tokenizer(cfg)
    _check_model(cfg)
    _check_training(cfg)
    _check_hardware(cfg)


def template_fields(template: str | None) -> list[str]:
    """Placeholders of a ``str.format`` template, in order, without repeats."""
    if not template:
        return []
    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name not in names:
            names.append(name)
    return names


def _check_dataset(cfg: ReplayConfig) -> None:
    ds = cfg.dataset
    if ds.kind == "synthetic":
        if ds.count is None:
            raise cfg.error(
                "dataset.count", "a synthetic dataset needs count: (number of examples)"
            )
        if ds.path is not None:
            raise cfg.error(
                "dataset.path",
                "a synthetic dataset takes no path; use kind: jsonl | text | arrow | disk",
            )
        length = ds.length
        if length.max is not None and length.max < length.min:
            raise cfg.error("dataset.length.max", f"must be at least length.min ({length.min})")
        return
    if ds.path is None:
        raise cfg.error("dataset.kind", f"a {ds.kind} dataset needs path:")
    path = cfg.resolve(ds.path)
    if not path.exists():
        raise cfg.error("dataset.path", f"{ds.path!r} does not exist (looked in {path})")
    want_dir = ds.kind == "disk"
    if want_dir != path.is_dir():
        what = "a save_to_disk folder" if want_dir else "a file"
        raise cfg.error("dataset.path", f"{ds.path!r} is not {what} (kind: {ds.kind})")


def _check_text(cfg: ReplayConfig) -> None:
    try:
        names = template_fields(cfg.text.template)
    except ValueError as exc:
        raise cfg.error(
            "text.template", f"is not a valid template ({exc}); write fields as {{name}}"
        ) from None
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise cfg.error("text.template", f"placeholder {{{bad[0]}}} must be a plain field name")
    fields = cfg.dataset.fields
    if cfg.dataset.kind == "synthetic" and fields and names:
        missing = [n for n in names if n not in fields]
        if missing:
            raise cfg.error(
                "text.template", f"uses {{{missing[0]}}} but dataset.fields is {fields}"
            )


def _check_stages(cfg: ReplayConfig) -> None:
    fmt, tok = cfg.text.format_at, cfg.tokenizer.tokenize_at
    if cfg.text.template and stage_index(fmt) > stage_index(tok):
        raise cfg.error(
            "tokenizer.tokenize_at",
            f"{tok} comes before text.format_at: {fmt}; text must be formatted before it is tokenized",
        )
    if cfg.padding == "packing" and tok not in ("ahead", "startup"):
        raise cfg.error(
            "padding",
            "packing concatenates tokenized examples, so it needs tokenizer.tokenize_at: ahead or startup",
        )
    if cfg.loop == "trainer" and "loop" in (fmt, tok):
        raise cfg.error(
            "loop",
            "Trainer has no hand-written loop to format or tokenize in; use loop: plain or tokenize_at: collate",
        )


def _check_local(cfg: ReplayConfig, key: str, value: str, offline_hint: str) -> None:
    path = cfg.resolve(value)
    if path.exists():
        return
    looks_local = value.startswith(("/", ".", "~")) or value.count("/") > 1
    if not looks_local and _HUBLIKE.fullmatch(value):
        raise cfg.error(
            key, f"{value!r} is not a local path and gpudoctor never downloads; {offline_hint}"
        )
    raise cfg.error(key, f"{value!r} does not exist (looked in {path})")


def _check_tokenizer(cfg: ReplayConfig) -> None:
    tok = cfg.tokenizer
    if tok.path is not None and tok.train_bpe is not None:
        raise cfg.error(
            "tokenizer.train_bpe", "give either tokenizer.path or tokenizer.train_bpe, not both"
        )
    if tok.path is not None:
        hint = "use tokenizer: {train_bpe: {vocab_size: 32000}} to train a BPE on the data offline, or a local folder saved with save_pretrained"
        _check_local(cfg, "tokenizer.path", tok.path, hint)


def _check_model(cfg: ReplayConfig) -> None:
    model = cfg.model
    if model.path is not None:
        hint = "use model: {arch: llama, config: {...}, params_b: N} to build a random-weight stand-in offline, or a local folder with config.json"
        _check_local(cfg, "model.path", model.path, hint)
        if not (cfg.resolve(model.path) / "config.json").is_file():
            raise cfg.error("model.path", f"{model.path!r} has no config.json")
    elif model.arch not in ARCHS:
        raise cfg.error(
            "model.arch", f"{model.arch!r} is not one the replay builds; known: {', '.join(ARCHS)}"
        )
    if model.path is None:
        _check_model_fits(cfg)
    if cfg.padding == "packing" and model.path is None and model.arch in MASKED_ARCHS:
        raise cfg.error("padding", f"packing is for causal language models, not {model.arch}")


def _check_model_fits(cfg: ReplayConfig) -> None:
    """Refuse a ``model.config`` this machine cannot train: computed from its sizes, never taken
    from a recorded parameter count (``params_b`` is what is predicted, not what is built)."""
    import psutil

    from gpudoctor.replay.size import TRAIN_BYTES_PER_PARAM, config_params

    params = config_params(cfg.model.arch, cfg.model.config)
    need = params * TRAIN_BYTES_PER_PARAM
    have = psutil.virtual_memory().total
    if need > have:
        raise cfg.error(
            "model.config",
            f"builds a {cfg.model.arch} of about {params:.3g} parameters, which needs about "
            f"{need / 2**30:,.0f} GiB to train here (weights, gradients, Adam) and this machine has "
            f"{have / 2**30:,.0f} GiB; shrink model.config and keep the real size in model.params_b, "
            "n_layers and hidden_size, which the prediction uses",
        )


def _check_training(cfg: ReplayConfig) -> None:
    tr = cfg.training
    if tr.dataloader_num_workers == 0:
        if tr.dataloader_prefetch_factor is not None:
            raise cfg.error(
                "training.dataloader_prefetch_factor",
                "needs dataloader_num_workers > 0 (DataLoader refuses it otherwise)",
            )
        if tr.dataloader_persistent_workers:
            raise cfg.error(
                "training.dataloader_persistent_workers",
                "needs dataloader_num_workers > 0 (DataLoader refuses it otherwise)",
            )
    if tr.bf16 and tr.fp16:
        raise cfg.error("training.fp16", "bf16 and fp16 cannot both be true")


def _check_hardware(cfg: ReplayConfig) -> None:
    hw = cfg.hardware
    if hw.target is None:
        return
    overrides = _spec_overrides(cfg)
    try:
        gpus.lookup(hw.target, overrides)
    except UserError as exc:
        raise cfg.error("hardware.target", str(exc)) from None


def _spec_overrides(cfg: ReplayConfig) -> dict[str, object]:
    import dataclasses

    spec = cfg.hardware.gpu_spec
    return dataclasses.asdict(spec) if spec is not None else {}
