"""The attach bootstrap run where a pending call can land: inside importlib's ``_ModuleLock.acquire``,
after this thread's ``_blocking_on`` entry is set (a trace function stands in for the debugger's
``Py_AddPendingCall``), then the interrupted import goes on. Prints, as JSON, whether the bootstrap
ran there, what became of the training's own import, and the status the attach wrote."""

from __future__ import annotations

import json
import os
import sys
import time
from types import FrameType
from typing import Any

bootstrap, control = sys.argv[1], sys.argv[2]
with open(bootstrap, encoding="utf-8") as fh:
    source = fh.read()
fired: list[int] = []


def in_acquire(frame: FrameType, event: str, arg: Any) -> Any:
    if not fired and event == "line":
        blocking_on = frame.f_globals.get("_blocking_on")
        if blocking_on is not None and sys.modules["_thread"].get_ident() in blocking_on:
            fired.append(1)
            exec(source, {"__name__": "__main__"})  # as PyRun_SimpleString runs it: this thread, this point
    return in_acquire


def tracer(frame: FrameType, event: str, arg: Any) -> Any:
    code = frame.f_code
    return in_acquire if (code.co_filename, code.co_name) == ("<frozen importlib._bootstrap>", "acquire") else None


sys.settrace(tracer)
try:
    import colorsys  # noqa: F401  # not loaded yet: its module lock is taken through acquire

    outcome = "imported"
except BaseException as exc:  # what the training would die of
    outcome = f"{type(exc).__name__}: {exc}"
sys.settrace(None)
status = os.path.join(control, f"{os.getpid()}.installed.json")
deadline = time.monotonic() + 30
while not os.path.exists(status) and time.monotonic() < deadline:
    time.sleep(0.02)
written = None
if os.path.exists(status):
    with open(status, encoding="utf-8") as fh:
        written = json.load(fh)
print(json.dumps({"fired": bool(fired), "import": outcome, "status": written}))
