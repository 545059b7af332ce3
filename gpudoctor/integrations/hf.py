"""Hugging Face ``TrainerCallback``: exact steps, the run's planned length, evals.

Two ways in: ``gpudoctor run`` adds the hooks' own callback to every Trainer by itself
(:mod:`gpudoctor.hooks.hf_callback`, events only), or the user adds
``GpuDoctorCallback(out="reports/x")`` to a Trainer in their script, and the callback
runs the whole doctor in-process and writes the report at train end. A failure of the
callback is said once and never stops the Trainer.
"""

from __future__ import annotations

from typing import Any

from gpudoctor import hooks
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.hf_callback import EventsCallback
from gpudoctor.hooks.hf_hooks import trainer_event
from gpudoctor.hooks.writer import EventWriter
from gpudoctor.integrations.loop import profile

_guard = guarded("Trainer callback")
_guard_end = guarded("Trainer callback end")


class GpuDoctorCallback(EventsCallback):
    def __init__(self, out: str | None = None, *, price_per_gpu_hour: float | None = None,
                 gpus: int | None = None, trackers: bool = True, _writer: EventWriter | None = None) -> None:
        super().__init__(_writer)
        self._out = out
        self._trackers = trackers
        self._price = price_per_gpu_hour
        self._gpus = gpus
        self._session: Any = None
        self.report: dict[str, Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start(kwargs.get("trainer"))
        super().on_train_begin(args, state, control, **kwargs)

    @_guard
    def _start(self, trainer: Any) -> None:
        if self._writer is None:
            self._session = profile(out=self._out, price_per_gpu_hour=self._price, gpus=self._gpus,
                                    trackers=self._trackers)
            self._session.__enter__()
            self._writer = hooks.writer()
            if self._writer is not None and trainer is not None:
                self._writer.emit(trainer_event(trainer))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_end(args, state, control, **kwargs)
        self._close()

    @_guard_end  # its own hook: the session closes even when the callback is off
    def _close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.__exit__(None, None, None)
            self.report = session.report
