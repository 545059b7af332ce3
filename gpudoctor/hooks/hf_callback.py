"""The Trainer callback the hooks add to every HF Trainer: exact steps and the planned length.

It only writes events into the recording the hooks already make (``gpudoctor run``,
``attach``); the public :class:`gpudoctor.GpuDoctorCallback` extends it to run the whole
doctor in-process. Imported only once ``transformers`` is. A failure is said once and
never stops the Trainer.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from gpudoctor.core.events import Event
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

# Every method runs inside the user's training: one guard, see gpudoctor.hooks.guard.
_guard = guarded("Trainer callback")


class EventsCallback(TrainerCallback):
    def __init__(self, writer: EventWriter | None = None) -> None:
        self._writer = writer

    def __reduce__(self) -> Any:
        """The one the hooks put on a Trainer is theirs, not the user's (issue #39): a Trainer pickled
        or deep-copied gets a plain ``TrainerCallback`` in its place (no writer, no lock, nothing of
        gpudoctor's to import where it is loaded). The public subclass, which the user added, copies whole."""
        if type(self) is EventsCallback:
            return (TrainerCallback, ())
        return super().__reduce__()

    @_guard
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._emit({"k": "plan", "t": time.time(), "max_steps": state.max_steps,
                    "num_train_epochs": getattr(args, "num_train_epochs", None),
                    "global_step": state.global_step})

    @_guard
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._emit({"k": "hf_step", "t": time.time(), "global_step": state.global_step})

    @_guard
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._emit({"k": "hf_end", "t": time.time(), "global_step": state.global_step})

    def _emit(self, event: Event) -> None:
        if self._writer is not None:
            self._writer.emit(event)
