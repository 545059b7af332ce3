"""Code run where a pending call can land: inside importlib's ``_ModuleLock.acquire``, after this
thread's ``_blocking_on`` entry is set (a trace function stands in for ``Py_AddPendingCall``), then
the interrupted import goes on. ``bootstrap PATH CONTROL`` runs the attach bootstrap there and waits
for the status it writes; ``pending`` runs the payload's pending-call wrapper around a function
that imports a module. Prints, as JSON, whether the code ran there, what became of the training's
own import, and what the code did."""

from __future__ import annotations

import json
import os
import sys
import time
from types import FrameType
from typing import Any

fired: list[int] = []
ran: list[bool] = []  # pending: whether the import had finished when the function ran
mode = sys.argv[1]
if mode == "bootstrap":
    control = sys.argv[3]
    with open(sys.argv[2], encoding="utf-8") as fh:
        source = fh.read()

    def land() -> None:
        exec(source, {"__name__": "__main__"})  # as PyRun_SimpleString runs it: this thread, this point
else:
    from gpudoctor.attach import payload

    def imports_a_module() -> None:
        __import__("fractions")  # not loaded yet: the import a detach or an install might make
        ran.append("colorsys" in sys.modules)

    land_run = payload._pending(imports_a_module, lambda exc: ran.append(False))

    def land() -> None:
        land_run(None)


def in_acquire(frame: FrameType, event: str, arg: Any) -> Any:
    if not fired and event == "line":
        blocking_on = frame.f_globals.get("_blocking_on")
        if blocking_on is not None and sys.modules["_thread"].get_ident() in blocking_on:
            fired.append(1)
            land()
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
deadline = time.monotonic() + 30
done: Any = None
while time.monotonic() < deadline and done is None:
    time.sleep(0.02)  # the main thread runs bytecode: a queued call runs here
    if mode == "bootstrap":
        status = os.path.join(control, f"{os.getpid()}.installed.json")
        if os.path.exists(status):
            with open(status, encoding="utf-8") as fh:
                done = json.load(fh)
    elif ran:
        done = {"ran_after_the_import": ran[0]}
print(json.dumps({"fired": bool(fired), "import": outcome, "done": done}))
