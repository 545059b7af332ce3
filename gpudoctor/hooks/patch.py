"""Reversible monkey-patching with timed spans and counters.

Every patch is recorded so :func:`restore_all` can undo it on detach. Nested
calls of one category (``save_pretrained`` → ``torch.save``) produce a single
outermost span, so the breakdown never counts a second twice. The wrappers call
the patched function exactly once, outside any guard: its result and its
exceptions are the caller's, untouched; only the timing around it is guarded.

Nor do the wrappers show in the caller's traceback (issue #38): an exception that passes through
one leaves without the wrapper's own frame (:func:`hide_wrapper`), so a ``loss.backward()`` that
raises reads as it does bare: the same exception, the user's frames and the library's, no doctor.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

_patched: list[tuple[Any, str, Any]] = []
_state = threading.local()


def depth(category: str) -> int:
    return getattr(_state, category, 0)


def _enter(category: str) -> int:
    d = getattr(_state, category, 0)
    setattr(_state, category, d + 1)
    return d


def _leave(category: str) -> None:
    setattr(_state, category, max(getattr(_state, category, 1) - 1, 0))


def hide_wrapper(exc: BaseException) -> None:
    """Take the calling wrapper's own frame off ``exc``'s traceback; the wrapper then re-raises
    with a bare ``raise``, which adds no frame back (``raise exc`` would add it again).

    Only the wrapper's own entry goes, and only when it heads the traceback: every frame the
    exception was raised through inside the call stays, and so does its type, message and cause.
    Call it only around the user's call, never around the doctor's own code (its faults must
    show where they are).
    """
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        exc.__traceback__ = tb.tb_next


def reset_depths() -> None:
    """Forget the nesting depths: a fresh install must not inherit a call left open by a failure."""
    global _state
    _state = threading.local()


def replace(owner: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``owner.attr`` with ``make(original)``; handles class/staticmethods."""
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    if raw is None:
        raw = getattr(owner, attr, None)
    if raw is None or getattr(raw, "__gpudoctor_original__", None) is not None:
        return False
    if isinstance(raw, classmethod):
        new: Any = classmethod(_mark(make(raw.__func__), raw.__func__))
    elif isinstance(raw, staticmethod):
        new = staticmethod(_mark(make(raw.__func__), raw.__func__))
    else:
        new = _mark(make(raw), raw)
    _patched.append((owner, attr, raw))
    setattr(owner, attr, new)
    return True


def _mark(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(wrapper, original)
    wrapper.__gpudoctor_original__ = original  # type: ignore[attr-defined]
    return wrapper


def restore_all() -> None:
    """Undo every patch, newest first."""
    while _patched:
        owner, attr, raw = _patched.pop()
        with contextlib.suppress(AttributeError, TypeError):
            setattr(owner, attr, raw)


# What a begin hands its end when the call is nested inside another of its category.
_NESTED = -1.0
_NESTED_SPAN = (_NESTED, _NESTED)


def span(writer: EventWriter, category: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper factory: time the outermost call of ``category`` as a span event."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = _span_begin(category)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                hide_wrapper(exc)
                raise
            finally:
                if began is not None:
                    _span_end(writer, category, name, began)

        return wrapper

    return make


@guarded("timed spans", vital=True)
def _span_begin(category: str) -> tuple[float, float]:
    if _enter(category):
        return _NESTED_SPAN
    return (time.time(), time.perf_counter())


@guarded("timed spans", vital=True)
def _span_end(writer: EventWriter, category: str, name: str, began: tuple[float, float]) -> None:
    _leave(category)
    t0, p0 = began
    if p0 != _NESTED:
        writer.emit({"k": "span", "c": category, "t0": t0, "dt": time.perf_counter() - p0, "name": name})


def counted(writer: EventWriter, counter: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper factory: add the outermost call's duration to a counter."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            p0 = _count_begin(counter)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                hide_wrapper(exc)
                raise
            finally:
                if p0 is not None:
                    _count_end(writer, counter, p0)

        return wrapper

    return make


@guarded("call counters", vital=True)
def _count_begin(counter: str) -> float:
    return _NESTED if _enter(counter) else time.perf_counter()


@guarded("call counters", vital=True)
def _count_end(writer: EventWriter, counter: str, p0: float) -> None:
    _leave(counter)
    if p0 != _NESTED:
        writer.count(counter, time.perf_counter() - p0)


def counted_cpu(writer: EventWriter, counter: str, detail: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`counted` that also adds the call's CPU seconds: the process's (every thread, so a
    tokenizer's thread pool counts), the calling thread's, and the time the calling thread sat
    runnable waiting for a core (Linux ``schedstat``). Wall less all three is what the call waited
    on (storage, network, a sleep): a worker blocked there needs no core. About 1 us of clocks plus
    one 64-byte ``pread`` each side (about 10 us a call in all: once per batch). ``detail=False``
    (a tokenizer call, many per batch) reads the process's CPU only, about 3 us a call."""

    begin = _cpu_begin if detail else _proc_cpu_begin

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = begin(counter)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                hide_wrapper(exc)
                raise
            finally:
                if began is not None:
                    _cpu_end(writer, counter, began)

        return wrapper

    return make


_NESTED_CPU = (_NESTED, 0.0, 0.0, 0.0)
_sched = threading.local()  # per thread: (pid, fd of /proc/thread-self/schedstat) or (pid, -1)


def run_delay_s() -> float:
    """Seconds the calling thread has waited on a run queue (runnable, no core), or 0.0 where the
    kernel does not say. The file is opened once per thread and process (a forked worker's thread
    opens its own: the parent's fd names the parent's thread)."""
    pid = os.getpid()
    got = getattr(_sched, "fd", None)
    if got is None or got[0] != pid:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        _sched.fd = got = (pid, fd)
    if got[1] < 0:
        return 0.0
    try:
        return int(os.pread(got[1], 64, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@guarded("call counters", vital=True)
def _cpu_begin(counter: str) -> tuple[float, float, float, float]:
    if _enter(counter):
        return _NESTED_CPU
    return (time.perf_counter(), time.process_time(), time.thread_time(), run_delay_s())


@guarded("call counters", vital=True)
def _proc_cpu_begin(counter: str) -> tuple[float, float, float, float]:
    if _enter(counter):
        return _NESTED_CPU
    return (time.perf_counter(), time.process_time(), -1.0, 0.0)


@guarded("call counters", vital=True)
def _cpu_end(writer: EventWriter, counter: str, began: tuple[float, float, float, float]) -> None:
    _leave(counter)
    p0, c0, t0, r0 = began
    if p0 == _NESTED:
        return
    if t0 < 0:  # process CPU only
        writer.count(counter, time.perf_counter() - p0, time.process_time() - c0)
    else:
        writer.count(counter, time.perf_counter() - p0, time.process_time() - c0, time.thread_time() - t0,
                     run_delay_s() - r0)
