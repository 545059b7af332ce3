"""Hooks into the Hugging Face stack: tokenizers, Trainer, datasets, safetensors."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpudoctor.common.redact import redact_mapping, redact_value
from gpudoctor.core.events import TrainerEvent
from gpudoctor.hooks import accelerate_hooks, apply, patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.torch_hooks import TorchHooks, safe_attr
from gpudoctor.hooks.writer import EventWriter


def install_tokenizers(writer: EventWriter, torch_hooks: TorchHooks, mod: ModuleType) -> None:
    """Time tokenizer calls (``tokenizer(...)``, ``encode``) into the ``tokenize`` counter."""
    base = getattr(mod, "PreTrainedTokenizerBase", None)
    if base is None:
        return
    counted = patch.counted_cpu(writer, "tokenize", detail=False)

    def make(fn: Any) -> Any:
        timed = counted(fn)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if torch_hooks.pad_token_id is None:
                _note_pad_id(torch_hooks, self)
            if apply.active():  # ``gpudoctor try``: the fix's max_length/padding
                kwargs = apply.tokenizer_kwargs(kwargs)
            return timed(self, *args, **kwargs)

        return call

    for name in ("__call__", "encode", "encode_plus", "batch_encode_plus"):
        if name in base.__dict__:
            patch.replace(base, name, make)


@guarded("tokenizer pad id")
def _note_pad_id(torch_hooks: TorchHooks, tokenizer: Any) -> None:
    pad = getattr(tokenizer, "pad_token_id", None)
    torch_hooks.pad_token_id = pad if isinstance(pad, int) and not isinstance(pad, bool) else None


def install_modeling(writer: EventWriter, mod: ModuleType) -> None:
    model = getattr(mod, "PreTrainedModel", None)
    if model is None:
        return
    patch.replace(model, "save_pretrained", patch.span(writer, "checkpoint", "save_pretrained"))
    patch.replace(model, "from_pretrained", patch.span(writer, "model_load", "from_pretrained"))


def install_trainer(writer: EventWriter, mod: ModuleType) -> None:
    trainer = getattr(mod, "Trainer", None)
    if trainer is None:
        return
    patch.replace(trainer, "_save_checkpoint", patch.span(writer, "checkpoint", "Trainer._save_checkpoint"))
    patch.replace(trainer, "evaluate", patch.span(writer, "eval", "Trainer.evaluate"))

    def make_init(fn: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            _adopt_trainer(writer, self)

        return __init__

    patch.replace(trainer, "__init__", make_init)


@guarded("Trainer settings")
def _adopt_trainer(writer: EventWriter, trainer: Any) -> None:
    writer.emit(trainer_event(trainer))
    from gpudoctor.hooks.hf_callback import (
        EventsCallback,  # imports transformers: only with a Trainer
    )

    if not any(isinstance(cb, EventsCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(EventsCallback(writer))


def trainer_event(trainer: Any) -> TrainerEvent:
    """The Trainer's arguments, redacted; never raises (``attach`` calls it on live Trainers)."""
    args = safe_attr(trainer, "args")
    try:
        arg_dict = args.to_dict() if args is not None else {}
    except Exception:  # an exotic args object must not break training
        arg_dict = {}
    transformers = sys.modules.get("transformers")
    return {
        "k": "trainer",
        "t": time.time(),
        "args": redact_mapping(arg_dict) if isinstance(arg_dict, dict) else {},
        "max_steps": _whole(safe_attr(args, "max_steps")),
        "num_train_epochs": _number(safe_attr(args, "num_train_epochs")),
        "version": _version(transformers),
    }


def _version(module: Any) -> str | None:
    version = safe_attr(module, "__version__")
    return redact_value(version) if isinstance(version, str) else None


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    """An int, or None: the loader drops a trainer event whose max_steps is another number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def install_datasets(writer: EventWriter, mod: ModuleType) -> None:
    """Time dataset formatting (``map``/``filter``), the usual cause of startup idle."""
    for cls_name in ("Dataset", "DatasetDict", "IterableDataset"):
        cls = getattr(mod, cls_name, None)
        if cls is None:
            continue
        for method in ("map", "filter"):
            if method in cls.__dict__:
                span = patch.span(writer, "format", f"datasets.{cls_name}.{method}")
                if cls_name == "Dataset" and method == "map":
                    def watched(fn: Callable[..., Any],
                                span: Callable[[Callable[..., Any]], Callable[..., Any]] = span) -> Callable[..., Any]:
                        return span(_watch_map_cache(writer, fn))

                    patch.replace(cls, method, watched)
                else:
                    patch.replace(cls, method, span)
    for fn_name in ("load_dataset", "load_from_disk"):
        if hasattr(mod, fn_name):
            # Loading is what the startup fix recommends: its own category, never charged as waste.
            patch.replace(mod, fn_name, patch.span(writer, "data_load", f"datasets.{fn_name}"))


def _watch_map_cache(writer: EventWriter, fn: Any) -> Any:
    """``Dataset.map`` that also says whether its result came from the datasets cache."""

    def map_(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            out = fn(self, *args, **kwargs)  # the user's call, outside any guard: its result is theirs
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _note_map_cache(writer, out, t0)
        return out

    return map_


@guarded("datasets cache note")
def _note_map_cache(writer: EventWriter, out: Any, t0: float) -> None:
    """``hit``: the result's cache files predate the call (read, not computed); ``miss``: written
    now (the next launch can read them); ``none``: an in-memory dataset, which is never cached."""
    files = [f.get("filename") for f in (getattr(out, "cache_files", None) or []) if isinstance(f, dict)]
    times = [os.stat(f).st_mtime for f in files if isinstance(f, str) and os.path.exists(f)]
    state = "none" if not times else ("hit" if max(times) < t0 else "miss")
    writer.emit({"k": "map_cache", "t": time.time(), "state": state})


def install_safetensors(writer: EventWriter, mod: ModuleType) -> None:
    for fn_name in ("save_file", "save_model"):
        if hasattr(mod, fn_name):
            patch.replace(mod, fn_name, patch.span(writer, "checkpoint", f"safetensors.{fn_name}"))


def install_accelerate(writer: EventWriter, mod: ModuleType) -> None:
    acc = getattr(mod, "Accelerator", None)
    if acc is not None:
        patch.replace(acc, "save_state", patch.span(writer, "checkpoint", "Accelerator.save_state"))
        accelerate_hooks.install(writer, acc)
