"""PyTorch Lightning callback: validation spans, and the in-process doctor.

``gpudoctor run`` adds the hooks' own callback to every Lightning ``Trainer`` by itself
(:mod:`gpudoctor.hooks.lightning_callback`, events only); in a script,
``Trainer(callbacks=[GpuDoctorLightningCallback(out="reports/x")])`` runs the doctor
in-process and writes the report when fitting ends. A failure of the callback is said
once and never stops the fit.
"""

from __future__ import annotations

from typing import Any

from gpudoctor import hooks
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.lightning_callback import events_class
from gpudoctor.integrations.loop import profile

_guard = guarded("Lightning callback")
_guard_end = guarded("Lightning callback end")


def _make_class() -> type:
    base = events_class(hooks.writer)

    class GpuDoctorLightningCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self, out: str | None = None, *, price_per_gpu_hour: float | None = None,
                     gpus: int | None = None, trackers: bool = True) -> None:
            super().__init__()
            self._out = out
            self._trackers = trackers
            self._price = price_per_gpu_hour
            self._gpus = gpus
            self._session: Any = None
            self.report: dict[str, Any] | None = None

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self._start()
            super().on_fit_start(trainer, pl_module)

        @_guard
        def _start(self) -> None:
            if not hooks.is_installed():
                self._session = profile(out=self._out, price_per_gpu_hour=self._price, gpus=self._gpus,
                                        trackers=self._trackers)
                self._session.__enter__()

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
