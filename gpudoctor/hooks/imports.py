"""Run a callback right after a module is imported (or now, if it already is).

Our own ~50 lines rather than ``wrapt.register_post_import_hook`` because this
code runs inside the patient's interpreter, which may not have wrapt: the
injected part of gpudoctor must be stdlib-only.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.RLock()
_finder: _PostImportFinder | None = None
_timed: set[str] = set()  # modules whose import is timed (startup's "imports" part)
_on_timed: Callable[[str, float, float], None] | None = None


def time_imports(names: tuple[str, ...], report: Callable[[str, float, float], None]) -> None:
    """Time the import of each of ``names`` not imported yet: ``report(name, t0, seconds)``.

    The heavy libraries' imports are a real part of startup (torch alone takes seconds);
    timing their loader's ``exec_module`` says how much, without touching anything else.
    """
    global _on_timed
    _on_timed = report
    for name in names:
        if name not in sys.modules:
            _timed.add(name)
            when_imported(name, lambda module: None)  # makes the finder wrap its loader


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported; immediately if it already is."""
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            _run(hook, module)
            return
        _hooks.setdefault(name, []).append(hook)
        if _finder is None:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)


def clear() -> None:
    """Forget pending hooks and remove the finder (used on detach)."""
    global _finder
    with _lock:
        _hooks.clear()
        _timed.clear()
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None


def _report_timed(name: str, t0: float, seconds: float) -> None:
    report = _on_timed
    if report is not None:
        with contextlib.suppress(Exception):  # saying how long an import took must never break it
            report(name, t0, seconds)


def _run(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # a failed patch must never break the user's import
        print(f"gpudoctor: could not hook {module.__name__}: {exc!r}", file=sys.stderr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname not in _hooks or getattr(self._busy, fullname, False):
            return None
        setattr(self._busy, fullname, True)
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            setattr(self._busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, fullname: str) -> None:
        self._inner = inner
        self._fullname = fullname

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self._fullname in _timed:
            t0, p0 = time.time(), time.perf_counter()
            self._inner.exec_module(module)
            _report_timed(self._fullname, t0, time.perf_counter() - p0)
        else:
            self._inner.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self._fullname, [])
        for hook in hooks:
            _run(hook, module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code...
        return getattr(self._inner, name)
