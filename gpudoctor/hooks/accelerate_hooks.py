"""Accelerate's ``Accelerator`` as built: its precision and accumulation, once per process.

A fix for an Accelerate loop is said as ``Accelerator(mixed_precision="bf16")`` or
``Accelerator(gradient_accumulation_steps=…)``: the ``accelerator`` event records the installed
``Accelerator.__init__``'s argument names (a name the version lacks is never prescribed), the
values it settled on and the version.
"""

from __future__ import annotations

import inspect
import sys
import time
from typing import Any

from gpudoctor.core.events import AcceleratorEvent
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter


def install(writer: EventWriter, accelerator_cls: Any) -> None:
    def make_init(fn: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            _record(writer, self, fn)

        return __init__

    patch.replace(accelerator_cls, "__init__", make_init)


@guarded("Accelerator settings")
def _record(writer: EventWriter, acc: Any, init: Any) -> None:
    try:
        params = [n for n in inspect.signature(init).parameters if n != "self"]
    except (TypeError, ValueError):
        params = []
    precision = getattr(acc, "mixed_precision", None)
    accum = getattr(acc, "gradient_accumulation_steps", None)
    event: AcceleratorEvent = {
        "k": "accelerator", "t": time.time(), "params": params,
        "mixed_precision": str(precision) if precision is not None else None,
        "gradient_accumulation_steps": accum if isinstance(accum, int) and not isinstance(accum, bool) else None,
        "version": getattr(sys.modules.get("accelerate"), "__version__", None),
    }
    writer.emit(event)
