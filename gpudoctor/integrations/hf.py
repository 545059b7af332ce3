"""Hugging Face ``TrainerCallback``: exact steps, the run's planned length, evals.

Two ways in: ``gpudoctor run`` adds it to every Trainer by itself (it then only
adds events to the injected recording), or the user adds
``GpuDoctorCallback(out="reports/x")`` to a Trainer in their script, and the
callback runs the whole doctor in-process and writes the report at train end.
A failure of the callback is said once and never stops the Trainer.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

# Every method runs inside the user's training: one guard, see gpudoctor.hooks.guard.
_guard = guarded("Trainer callback")
_guard_end = guarded("Trainer callback end")


class GpuDoctorCallback(TrainerCallback):
    def __init__(self, out: str | None = None, *, price_per_gpu_hour: float | None = None,
                 gpus: int | None = None, _writer: EventWriter | None = None) -> None:
        self._writer = _writer
        self._out = out
        self._price = price_per_gpu_hour
        self._gpus = gpus
        self._session: Any = None
        self.report: dict[str, Any] | None = None

    @_guard
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._writer is None:
            from gpudoctor.integrations.loop import profile

            self._session = profile(out=self._out, price_per_gpu_hour=self._price, gpus=self._gpus)
            self._session.__enter__()
            from gpudoctor import hooks

            self._writer = hooks.writer()
            trainer = kwargs.get("trainer")
            if self._writer is not None and trainer is not None:
                from gpudoctor.hooks.hf_hooks import trainer_event

                self._writer.emit(trainer_event(trainer))
        self._emit({"k": "plan", "t": time.time(), "max_steps": state.max_steps,
                    "num_train_epochs": getattr(args, "num_train_epochs", None),
                    "global_step": state.global_step})

    @_guard
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._emit({"k": "hf_step", "t": time.time(), "global_step": state.global_step})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end(state)
        self._close()

    @_guard
    def _end(self, state: Any) -> None:
        self._emit({"k": "hf_end", "t": time.time(), "global_step": state.global_step})

    @_guard_end  # its own hook: the session closes even when the callback is off
    def _close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.__exit__(None, None, None)
            self.report = session.report

    def _emit(self, event: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.emit(event)
