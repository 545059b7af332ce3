"""CUDA events on the training stream: host syncs and H2D copies seen by hooks.

Switched on by :mod:`gpudoctor.hooks.torch_hooks` at the first training forward on a CUDA
device, never on a CPU run (nothing is patched, nothing recorded). Per step the hot path
adds two ``Event.record()`` around each loader wait, the first wait's end doubling as the
step's reference (one at the step end only when it had no wait; see
:mod:`gpudoctor.hooks.device_clock`); a sync or a CPU->GPU copy adds one or two, a checkpoint
save two.
"""

from __future__ import annotations

import atexit
import sys
import time
from typing import Any

from gpudoctor.hooks import patch
from gpudoctor.hooks.device_clock import CudaClock, DeviceClock, GpuMarks
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

SYNC_METHODS = ("item", "tolist", "cpu")  # Tensor methods that wait for the GPU when the tensor is on it


def start(writer: EventWriter, device: str = "cuda", clock: DeviceClock | None = None) -> GpuMarks:
    """Marks on ``clock`` (CUDA events by default), syncs and copies counted on ``device`` tensors."""
    torch = sys.modules["torch"]
    marks = GpuMarks(clock if clock is not None else CudaClock(torch), writer.emit)
    writer.emit({"k": "gpu_clock", "t": time.time(), "device": device,
                 "source": "cuda_events" if clock is None else type(clock).__name__})
    for name in SYNC_METHODS:
        patch.replace(torch.Tensor, name, _sync_wrapper(marks, device))
    if device == "cuda":
        patch.replace(torch.cuda, "synchronize", _plain_sync_wrapper(marks))
    patch.replace(torch.Tensor, "to", _copy_wrapper(marks, device))
    patch.replace(torch.Tensor, "cuda", _copy_wrapper(marks, device, cuda_call=True))
    atexit.register(_final_poll, marks)  # after the training's own exit work, before the writer closes
    return marks


def _compiling() -> Any:
    """``torch.compiler.is_compiling``: traced by torch.compile, our wrappers step aside (a constant
    True to dynamo, so no graph break of ours)."""
    compiler = getattr(sys.modules["torch"], "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


def _sync_wrapper(marks: GpuMarks, device: str) -> Any:
    def make(fn: Any) -> Any:
        perf = time.perf_counter
        compiling = _compiling()

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                try:
                    return fn(self, *args, **kwargs)
                except BaseException as exc:
                    patch.hide_wrapper(exc)
                    raise
            on = self.device.type == device and not patch.depth("eval")  # an eval's syncs are the eval's
            p0 = perf()
            try:
                out = fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            if on:
                _synced(marks, perf() - p0)
            return out

        return method

    return make


def _plain_sync_wrapper(marks: GpuMarks) -> Any:
    def make(fn: Any) -> Any:
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            p0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            _synced(marks, time.perf_counter() - p0)
            return out

        return synchronize

    return make


def _to_device(args: tuple[Any, ...], kwargs: dict[str, Any], device: str) -> bool:
    """Does ``.to(*args, **kwargs)`` name ``device`` (a device, its name, or a tensor on it)?"""
    for a in (*args[:1], kwargs.get("device"), kwargs.get("other")):
        if a is None:
            continue
        kind = getattr(a, "type", None) if not isinstance(a, str) else a.split(":", 1)[0]
        if kind is None:
            kind = getattr(getattr(a, "device", None), "type", None)
        if kind == device:
            return True
    return False


def _copy_wrapper(marks: GpuMarks, device: str, cuda_call: bool = False) -> Any:
    """``tensor.to(...)``/``.cuda()`` from the CPU onto ``device``: timed on the GPU between two events."""

    def make(fn: Any) -> Any:
        perf = time.perf_counter
        compiling = _compiling()

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (compiling() or self.device.type != "cpu" or device == "cpu"
                    or not (cuda_call or _to_device(args, kwargs, device))):
                try:
                    return fn(self, *args, **kwargs)  # a cast, or a copy that stays on the host: no event
                except BaseException as exc:
                    patch.hide_wrapper(exc)
                    raise
            before = _mark(marks)
            p0 = perf()
            try:
                out = fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            if before is not None and getattr(getattr(out, "device", None), "type", None) == device:
                _copied(marks, before, perf() - p0)
            return out

        return method

    return make


@guarded("GPU clock: syncs")
def _synced(marks: GpuMarks, blocked_s: float) -> None:
    marks.sync(blocked_s)


@guarded("GPU clock: copies")
def _mark(marks: GpuMarks) -> Any:
    return marks.mark()


@guarded("GPU clock: copies")
def _copied(marks: GpuMarks, before: Any, blocked_s: float) -> None:
    marks.h2d(before, blocked_s)


@guarded("GPU clock: read back")
def _final_poll(marks: GpuMarks) -> None:
    marks.poll()
