"""The Lightning callback the hooks add to every Lightning ``Trainer``: validation spans and
the planned length, into the recording the hooks already make.

The public :class:`gpudoctor.GpuDoctorLightningCallback` extends it to run the whole doctor
in-process. Steps, data wait, saves and padding come from the same hooks as everywhere
else. A failure is said once and never stops the fit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

from gpudoctor.core.events import PlanEvent
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

WriterFn = Callable[[], EventWriter | None]

# Every method runs inside the user's training: one guard, see gpudoctor.hooks.guard.
_guard = guarded("Lightning callback")
# Validation spans set the eval depth every other hook reads: a half-done one would skew them all.
_guard_val = guarded("Lightning validation", vital=True)

_CLASS: type | None = None


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # type: ignore[assignment, no-redef, unused-ignore]  # the same class in the old package's name
    return Callback


def events_class(writer: WriterFn) -> type:
    """The events-only callback class, built on first use (Lightning is imported by then).

    ``writer`` returns the active event writer (``gpudoctor.hooks.writer``), read at each event.
    """
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class(_callback_base(), writer)
    return _CLASS


def _make_class(base: type, writer: WriterFn) -> type:
    class LightningEvents(base):  # type: ignore[misc, valid-type, unused-ignore]  # a base known at run time
        def __init__(self) -> None:
            super().__init__()
            self._val_t0: tuple[float, float] | None = None

        @_guard
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            w = writer()
            if w is not None:
                w.emit(cast(PlanEvent, {"k": "plan", "t": time.time(),
                        "max_steps": trainer.max_steps if trainer.max_steps > 0 else None,
                        "num_train_epochs": trainer.max_epochs, "global_step": trainer.global_step,
                        "framework": "lightning", **_trainer_settings(trainer)}))

        @_guard_val
        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            patch._enter("eval")
            self._val_t0 = (time.time(), time.perf_counter())

        @_guard_val
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            patch._leave("eval")
            w = writer()
            if w is not None and self._val_t0 is not None and patch.depth("eval") == 0:
                t0, p0 = self._val_t0
                w.emit({"k": "span", "c": "eval", "t0": t0, "dt": time.perf_counter() - p0,
                        "name": "lightning.validation"})
            self._val_t0 = None

    return LightningEvents


def _trainer_settings(trainer: Any) -> dict[str, Any]:
    """The Trainer's eval and precision settings, so a fix names Lightning's own arguments."""
    out: dict[str, Any] = {}
    for name in ("val_check_interval", "limit_val_batches", "check_val_every_n_epoch"):
        if not hasattr(trainer, name):
            continue  # this Lightning has no such setting: a fix will not name it
        value = getattr(trainer, name)
        out[name] = value if value is None or isinstance(value, (int, float)) else str(value)
    precision = getattr(getattr(trainer, "strategy", None), "precision_plugin", None)
    out["precision"] = str(getattr(precision, "precision", None) or getattr(trainer, "precision", None))
    try:
        import lightning

        out["version"] = str(lightning.__version__)
    except ImportError:
        out["version"] = None
    return out


def install_into_trainer_class(mod: ModuleType, writer: WriterFn) -> None:
    """Under ``gpudoctor run``: add the events callback to every Lightning Trainer created."""
    trainer_cls = getattr(mod, "Trainer", None)
    if trainer_cls is None:
        return
    cls = events_class(writer)

    @_guard
    def adopt(trainer: Any) -> None:
        if not any(isinstance(cb, cls) for cb in trainer.callbacks):
            trainer.callbacks.append(cls())

    def make(fn: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            fn(self, *args, **kwargs)
            adopt(self)

        return __init__

    patch.replace(trainer_cls, "__init__", make)
