"""The exception that ended the training, as one ``uncaught`` event: what ``try`` says of a crash.

``sys.excepthook`` is wrapped: the user's own hook (or Python's) still prints the traceback; we
add its last words to the recording (type, redacted message, the last frames as
``file:line in function``), so a trial that crashed is reported as a crash with its own lines,
not as "too few steps". Stdlib-only, like the rest of the injected part.

A traceback with a frame of gpudoctor's in it is said to be ours (issue #39), under the traceback
and in the report: ``doctor_raised`` when the exception came from our own code (gpudoctor's bug,
certainly), else ``doctor_frames`` alone: it passed through a wrapper of ours (``torch.save``, a
DataLoader's ``__next__``), which calls the user's function exactly once, so the fault is ours only
if the command does not fail without the hooks; both say how to run without them
(``GPUDOCTOR_HOOKS=0``).
"""

from __future__ import annotations

import os
import re
import sys
import time
import traceback
from types import TracebackType
from typing import Any

from gpudoctor.common.redact import redact_value
from gpudoctor.common.wording import doctor_fault_words
from gpudoctor.core.events import UncaughtEvent
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

LAST_FRAMES = 3
MAX_MESSAGE = 300
DOCTOR_FRAMES = 4  # of ours kept: the outermost (the hook entered) and the innermost
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../gpudoctor


def install(writer: EventWriter) -> None:
    patch.replace(sys, "excepthook", lambda fn: _wrap(writer, fn))


def _wrap(writer: EventWriter, fn: Any) -> Any:
    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> Any:
        said = _record(writer, kind, exc, tb)
        try:
            return fn(kind, exc, tb)
        finally:
            if said:
                print(said, file=sys.stderr)

    return excepthook


@guarded("crash record", default="")
def _record(writer: EventWriter, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """The ``uncaught`` event; returns what to say under the traceback when a frame of ours is in it."""
    if issubclass(kind, KeyboardInterrupt) or _launcher_signal(kind):
        return ""  # a stop (try's own SIGINT included), not a crash
    every = traceback.extract_tb(tb)
    frames = every[-LAST_FRAMES:]
    # A DataLoader worker's error carries the worker's whole traceback: its last line is the error.
    said = [line for line in str(exc).strip().splitlines() if line.strip()]
    message = redact_value(" ".join(said[-1].split()) if said else "")[:MAX_MESSAGE]
    event: UncaughtEvent = {"k": "uncaught", "t": time.time(), "error": kind.__name__, "message": message,
                            "frames": [f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in frames]}
    every += _worker_frames(str(exc))  # deeper than ours: where a DataLoader worker raised
    ours = [f for f in every if _is_ours(f.filename)]
    if ours:
        kept = ours[:1] + ours[1:][-(DOCTOR_FRAMES - 1):]  # where the training entered our code, and the innermost
        event["doctor_frames"] = [_where(f) for f in kept]
        event["doctor_raised"] = _is_ours(every[-1].filename)
    writer.emit(event)
    return doctor_fault_words(event["doctor_raised"], event["doctor_frames"]) if ours else ""


_FILE_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _worker_frames(message: str) -> list[traceback.FrameSummary]:
    """The frames of a traceback carried as text (``Caught ValueError in DataLoader worker process 0``)."""
    found = (_FILE_LINE.match(line) for line in message.splitlines())
    return [traceback.FrameSummary(m[1], int(m[2]), m[3], line="") for m in found if m]


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def _where(frame: traceback.FrameSummary) -> str:
    """``gpudoctor/hooks/torch_hooks.py:97 in save``: our frames named from the package root."""
    path = os.path.relpath(os.path.abspath(frame.filename), os.path.dirname(_PACKAGE))
    return f"{path}:{frame.lineno} in {frame.name}"


def _launcher_signal(kind: type[BaseException]) -> bool:
    """torchrun's agent turns SIGINT/SIGTERM into its ``SignalException``: a stop, like Ctrl-C."""
    return kind.__name__ == "SignalException" and kind.__module__.startswith("torch.distributed.elastic")
