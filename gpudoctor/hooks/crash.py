"""The exception that ended the training, as one ``uncaught`` event: what ``try`` says of a crash.

``sys.excepthook`` is wrapped: the user's own hook (or Python's) still prints the traceback; we
add its last words to the recording (type, redacted message, the last frames as
``file:line in function``), so a trial that crashed is reported as a crash with its own lines,
not as "too few steps". Stdlib-only, like the rest of the injected part.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from types import TracebackType
from typing import Any

from gpudoctor.common.redact import redact_value
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

LAST_FRAMES = 3
MAX_MESSAGE = 300


def install(writer: EventWriter) -> None:
    patch.replace(sys, "excepthook", lambda fn: _wrap(writer, fn))


def _wrap(writer: EventWriter, fn: Any) -> Any:
    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> Any:
        _record(writer, kind, exc, tb)
        return fn(kind, exc, tb)

    return excepthook


@guarded("crash record")
def _record(writer: EventWriter, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt) or _launcher_signal(kind):
        return  # a stop (try's own SIGINT included), not a crash
    frames = traceback.extract_tb(tb)[-LAST_FRAMES:]
    # A DataLoader worker's error carries the worker's whole traceback: its last line is the error.
    said = [line for line in str(exc).strip().splitlines() if line.strip()]
    message = redact_value(" ".join(said[-1].split()) if said else "")[:MAX_MESSAGE]
    writer.emit({"k": "uncaught", "t": time.time(), "error": kind.__name__, "message": message,
                 "frames": [f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in frames]})


def _launcher_signal(kind: type[BaseException]) -> bool:
    """torchrun's agent turns SIGINT/SIGTERM into its ``SignalException``: a stop, like Ctrl-C."""
    return kind.__name__ == "SignalException" and kind.__module__.startswith("torch.distributed.elastic")
