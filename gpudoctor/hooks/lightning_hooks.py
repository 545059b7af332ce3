"""Hooks into Lightning's saving: the whole save as one checkpoint span, and how saves are set.

Lightning's ``torch.save`` writes into a memory buffer; the state dump before it
(``trainer._checkpoint_connector.dump_checkpoint``) and the CheckpointIO's write to disk
after it are most of a save's cost. So the span is ``Trainer.save_checkpoint`` (and, for
Fabric and direct callers, the CheckpointIO's ``save_checkpoint``): ``torch.save`` inside it
nests into the same span (:mod:`gpudoctor.hooks.patch`). Each ``ModelCheckpoint`` records its
settings once (``lightning_checkpoint`` event), so a fix is said in ``ModelCheckpoint``'s own
arguments, and ``gpudoctor try`` sets them there (:mod:`gpudoctor.hooks.apply`).
"""

from __future__ import annotations

import inspect
import sys
import time
from types import ModuleType
from typing import Any

from gpudoctor.hooks import apply, patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

# ModelCheckpoint's arguments the doctor reads and ``try`` may set.
CHECKPOINT_ARGS = ("every_n_train_steps", "every_n_epochs", "train_time_interval", "save_top_k",
                   "save_weights_only", "save_last", "monitor")


def install(writer: EventWriter, mod: ModuleType) -> None:
    """Patch the Trainer's and the CheckpointIO's save, and ModelCheckpoint's ``__init__``."""
    trainer_cls = getattr(mod, "Trainer", None)
    if trainer_cls is not None:
        patch.replace(trainer_cls, "save_checkpoint", patch.span(writer, "checkpoint", "Trainer.save_checkpoint"))
    io = sys.modules.get("lightning.fabric.plugins.io.torch_io") or sys.modules.get(
        "lightning_fabric.plugins.io.torch_io")
    io_cls = getattr(io, "TorchCheckpointIO", None)
    if io_cls is not None:
        patch.replace(io_cls, "save_checkpoint", patch.span(writer, "checkpoint", "CheckpointIO.save_checkpoint"))
    callbacks = getattr(mod, "callbacks", None)
    ckpt_cls = getattr(callbacks, "ModelCheckpoint", None)
    if ckpt_cls is not None:
        patch.replace(ckpt_cls, "__init__", lambda fn: _wrap_init(writer, fn))


def _wrap_init(writer: EventWriter, fn: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs = apply.model_checkpoint_kwargs(fn, self, args, kwargs)
        try:
            fn(self, *args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _record(writer, self)

    return __init__


@guarded("Lightning checkpoint settings")
def _record(writer: EventWriter, cb: Any) -> None:
    values: dict[str, Any] = {}
    for name in CHECKPOINT_ARGS:
        value = getattr(cb, f"_{name}", getattr(cb, name, None))
        if value is None or isinstance(value, (int, float, bool, str)):
            values[name] = value
        else:
            values[name] = str(value)
    lightning = sys.modules.get("lightning") or sys.modules.get("pytorch_lightning")
    init = _base_init(cb)
    params = [n for n in inspect.signature(init).parameters if n != "self"] if init is not None else []
    writer.emit({"k": "lightning_checkpoint", "t": time.time(), "args": values, "params": params,
                 "class": type(cb).__name__, "version": getattr(lightning, "__version__", None)})


def _base_init(cb: Any) -> Any:
    """The installed ModelCheckpoint's own ``__init__`` (a subclass may wrap it)."""
    for klass in type(cb).__mro__:
        if klass.__name__ == "ModelCheckpoint":
            init = klass.__dict__.get("__init__")
            return getattr(init, "__gpudoctor_original__", init)
    return None
