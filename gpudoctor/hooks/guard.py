"""The one guard around every hook body: our failure must never reach the training.

Hooks run inside someone else's training, on their batches and objects. Every
body of ours (bookkeeping around a wrapped call, optimizer/module hooks,
profiler windows, callbacks, the event writer) is decorated with
:func:`guarded`. The user's own call is never inside a guarded body: wrappers
call it themselves, exactly once, and let its result or exception through
untouched, so only *our* exceptions are caught here.

A failure is swallowed, counted, and said once: one ``hook_error`` event in the
recording and one line on stderr, after which that hook is off. A hook whose
loss would skew the breakdown (data wait, steps, timed spans, the writer) is
``vital``: its failure turns the whole in-process recording off (every vital
hook, and the writer after the ``hook_error`` line), so the report covers the
time before it rather than a silently wrong split.
Stdlib-only, like the rest of the injected part.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Container
from typing import Any, Protocol, TypeVar

from gpudoctor.common.redact import redact_value


class Sink(Protocol):
    """Where a failed hook's ``hook_error`` goes: the event writer (its flush is itself guarded,
    so guard names only what it calls, never the writer's module)."""

    def emit(self, event: Any) -> None: ...

    def last_words(self, event: Any) -> None: ...


F = TypeVar("F", bound=Callable[..., Any])


class _Site:
    """One named hook; ``on`` is the single flag its guarded bodies read per call."""

    __slots__ = ("where", "vital", "on", "errors")

    def __init__(self, where: str, vital: bool) -> None:
        self.where = where
        self.vital = vital
        self.on = True
        self.errors = 0


_sites: dict[str, _Site] = {}
_lock = threading.Lock()
_sink: Sink | None = None


def guarded(where: str, *, vital: bool = False, default: Any = None) -> Callable[[F], F]:
    """Decorate a hook body: on an exception it returns ``default`` and the hook goes off.

    Bodies sharing a ``where`` are one hook: they go off together.
    """
    site = _sites.get(where)
    if site is None:
        site = _sites[where] = _Site(where, vital)

    def decorate(fn: F) -> F:
        def body(*args: Any, **kwargs: Any) -> Any:
            if not site.on:
                return default
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # ours, never the user's: see the module docstring
                _failed(site, exc)
                return default

        functools.update_wrapper(body, fn)
        return body  # type: ignore[return-value]

    return decorate


def arm(writer: Sink) -> None:
    """A fresh install (run, attach, re-attach): every hook on, failures go to ``writer``."""
    global _sink
    with _lock:
        _sink = writer
        for site in _sites.values():
            site.on = True
            site.errors = 0


def disarm() -> None:
    global _sink
    with _lock:
        _sink = None


def errors() -> int:
    """Failures caught since the last :func:`arm`."""
    return sum(site.errors for site in _sites.values())


def _failed(site: _Site, exc: Exception) -> None:
    try:
        with _lock:
            site.errors += 1
            if not site.on:
                return  # already said
            site.on = False
            if site.vital:  # the others stay on but record nothing: the writer stops below
                for other in _sites.values():
                    if other.vital:
                        other.on = False
            sink = _sink
        text = _describe(exc)
        if site.vital:
            said = (
                f"in-process recording stopped in pid {os.getpid()} after an internal error in "
                f"{site.where!r} ({text}); the training goes on, the report covers the time before"
            )
        else:
            said = (
                f"hook {site.where!r} off in pid {os.getpid()} after an internal error ({text}); "
                "the training goes on"
            )
        print(f"gpudoctor: {said}", file=sys.stderr, flush=True)
        if sink is not None:
            event = {
                "k": "hook_error",
                "t": time.time(),
                "where": site.where,
                "vital": site.vital,
                "error": type(exc).__name__,
                "message": text,
            }
            sink.last_words(event) if site.vital else sink.emit(event)
    except Exception:  # saying so failed (stderr closed, disk gone): stay quiet
        pass


def _describe(exc: Exception) -> str:
    """``Type: message``, redacted and short: it may quote the user's data."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    message = redact_value(" ".join(message.split()))
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def untraced(hook: Callable[..., Any], among: Container[int] | None = None) -> Callable[..., Any]:
    """A global module hook that ``torch.compile`` traces as nothing (issue #39).

    Dynamo inlines global forward hooks into the graph it captures; ours would break it into many
    (our bodies touch threads and locks), and the graphs a model compiles into decide its kernels
    and, with dropout, its random numbers: the weights would differ from a bare run. While Dynamo
    traces, ``is_compiling()`` is a constant True, so the hook is an empty function to it; the
    compiled call runs no hook of ours (what happens outside the compiled region still counts).
    ``among``: ids of the only modules the hook is for; any other returns at once, before a frame of
    the hook's own (a global hook is called for every submodule of every forward while it is in).
    """
    torch = sys.modules["torch"]  # maybe still importing: ``torch.compiler`` is read at the first call

    def module_hook(*args: Any) -> Any:
        if torch.compiler.is_compiling() or (among is not None and id(args[0]) not in among):
            return None
        return hook(*args)

    module_hook.__gpudoctor_hook__ = True  # type: ignore[attr-defined]  # see hooks_but_ours
    return module_hook


def hooks_but_ours(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``torch.nn.modules.module._has_any_global_hook`` that does not count ours.

    torch asks it only to warn, at each call of a ``torch.compile(module)``, that global hooks fire
    an extra time for the compiled wrapper: ours are built for that, and the warning would be a line
    a bare run never prints. Any hook of the user's still counts.
    """
    module_mod = sys.modules["torch.nn.modules.module"]
    names = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
             "_global_forward_hooks")

    def _has_any_global_hook() -> Any:
        if not fn():
            return False
        return any(not getattr(h, "__gpudoctor_hook__", False)
                   for name in names for h in getattr(module_mod, name, {}).values())

    return _has_any_global_hook
