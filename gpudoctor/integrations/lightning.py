"""PyTorch Lightning callback: validation spans, and the in-process doctor.

``gpudoctor run`` adds it to every Lightning ``Trainer`` by itself; in a script,
``Trainer(callbacks=[GpuDoctorLightningCallback(out="reports/x")])`` runs the
doctor in-process and writes the report when fitting ends. Steps, data wait,
saves and padding come from the same hooks as everywhere else. A failure of
the callback is said once and never stops the fit.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from gpudoctor import hooks
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded

# Every method runs inside the user's training: one guard, see gpudoctor.hooks.guard.
_guard = guarded("Lightning callback")
# Validation spans set the eval depth every other hook reads: a half-done one would skew them all.
_guard_val = guarded("Lightning validation", vital=True)
_guard_end = guarded("Lightning callback end")


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # type: ignore[no-redef]
    return Callback


def _make_class() -> type:
    base = _callback_base()

    class GpuDoctorLightningCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self, out: str | None = None, *, price_per_gpu_hour: float | None = None,
                     gpus: int | None = None) -> None:
            super().__init__()
            self._out = out
            self._price = price_per_gpu_hour
            self._gpus = gpus
            self._session: Any = None
            self._val_t0: tuple[float, float] | None = None
            self.report: dict[str, Any] | None = None

        @_guard
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            if not hooks.is_installed():
                from gpudoctor.integrations.loop import profile

                self._session = profile(out=self._out, price_per_gpu_hour=self._price, gpus=self._gpus)
                self._session.__enter__()
            w = hooks.writer()
            if w is not None:
                w.emit({"k": "plan", "t": time.time(), "max_steps": trainer.max_steps if trainer.max_steps > 0 else None,
                        "num_train_epochs": trainer.max_epochs, "global_step": trainer.global_step})

        @_guard_val
        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            patch._enter("eval")
            self._val_t0 = (time.time(), time.perf_counter())

        @_guard_val
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            patch._leave("eval")
            w = hooks.writer()
            if w is not None and self._val_t0 is not None and patch.depth("eval") == 0:
                t0, p0 = self._val_t0
                w.emit({"k": "span", "c": "eval", "t0": t0, "dt": time.perf_counter() - p0, "name": "lightning.validation"})
            self._val_t0 = None

        @_guard_end  # its own hook: the session closes even when the callback is off
        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if self._session is not None:
                session, self._session = self._session, None
                session.__exit__(None, None, None)
                self.report = session.report

    return GpuDoctorLightningCallback


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "GpuDoctorLightningCallback":
        if _CLASS is None:
            _CLASS = _make_class()
        return _CLASS
    raise AttributeError(name)


def install_into_trainer_class(mod: ModuleType) -> None:
    """Under ``gpudoctor run``: add the callback to every Lightning Trainer created."""
    trainer_cls = getattr(mod, "Trainer", None)
    if trainer_cls is None:
        return
    cls = __getattr__("GpuDoctorLightningCallback")

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
