"""Reversible monkey-patching with timed spans and counters.

Every patch is recorded so :func:`restore_all` can undo it on detach. Nested
calls of one category (``save_pretrained`` → ``torch.save``) produce a single
outermost span, so the breakdown never counts a second twice.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

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
    setattr(_state, category, getattr(_state, category, 1) - 1)


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


def span(writer: EventWriter, category: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper factory: time the outermost call of ``category`` as a span event."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _enter(category):
                try:
                    return fn(*args, **kwargs)
                finally:
                    _leave(category)
            t0 = time.time()
            p0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _leave(category)
                writer.emit({"k": "span", "c": category, "t0": t0, "dt": time.perf_counter() - p0, "name": name})

        return wrapper

    return make


def counted(writer: EventWriter, counter: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper factory: add the outermost call's duration to a counter."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _enter(counter):
                try:
                    return fn(*args, **kwargs)
                finally:
                    _leave(counter)
            p0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _leave(counter)
                writer.count(counter, time.perf_counter() - p0)

        return wrapper

    return make
