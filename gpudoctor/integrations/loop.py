"""Context manager and step hook for hand-written training loops.

    with gpudoctor.profile(out="reports/exp1", price_per_gpu_hour=2.5) as doc:
        for batch in loader:
            ...
            optimizer.step()          # steps are seen automatically
            if i % 500 == 0:
                with doc.eval():      # mark evaluation explicitly
                    evaluate(model)
    print(doc.report["verdict"])

Under ``gpudoctor run`` the hooks are already in the process; ``profile`` then
only adds markers to that recording and writes no second report.
``gpudoctor.step()`` marks a step boundary for loops without ``torch.optim``.
Markers and the report at the end are guarded like every hook: they never
stop the loop or the script (see :mod:`gpudoctor.hooks.guard`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from gpudoctor import hooks
from gpudoctor.common.proctime import started_at
from gpudoctor.common.redact import redact_argv
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.launch.recorder import Recorder, RecorderOptions, default_out
from gpudoctor.recording.store import RunFolder

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report


class profile:  # noqa: N801 - reads as a function at the call site, like torch.profiler.profile
    def __init__(self, out: str | Path | None = None, *, price_per_gpu_hour: float | None = None,
                 gpus: int | None = None, interval_s: float = 0.1, write_reports: bool = True,
                 trackers: bool = True) -> None:
        self.out = Path(out) if out is not None else None
        self.price = price_per_gpu_hour
        self.gpus = gpus
        self.interval_s = interval_s
        self.write_reports = write_reports
        self.trackers = trackers  # add the figures to the live MLflow / W&B / TensorBoard runs (docs/trackers.md)
        self.report: Report | None = None
        self.folder: Path | None = None
        self._at: Path | None = None  # the run folder's held descriptor, which the report is written through
        self._recorder: Any = None
        self._owner = False

    def __enter__(self) -> profile:
        if hooks.is_installed():
            return self  # recorded by an outer doctor (gpudoctor run / attach)
        folder = RunFolder(self.out or default_out("profile")).create()
        self._recorder = Recorder(folder, RecorderOptions(mode="run", command=redact_argv(sys.argv),
                                                          interval_s=self.interval_s,
                                                          price_per_gpu_hour=self.price, gpus=self.gpus))
        self._recorder.prepare()
        self._recorder.start(os.getpid(), *_session_start())
        hooks.install(folder.root)
        self.folder, self._at = folder.root, folder.at
        self._owner = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Returns None: an exception of the user's loop goes on, untouched.
        if not self._owner:
            return
        self._owner = False
        global _last_end
        _last_end = time.time()
        self._finish(exc_type)

    @guarded("profile report")
    def _finish(self, exc_type: Any) -> None:
        """After the loop: a failure to write the report must not fail the script that trained."""
        hooks.uninstall()
        status = "finished" if exc_type is None else ("interrupted" if exc_type is KeyboardInterrupt else "crashed")
        self._recorder.stop(status, None if exc_type is None else 1)
        if self.write_reports and self._at is not None:
            from gpudoctor.pipeline import (
                finish,  # the analysis stack: only when a report is wanted
            )
            from gpudoctor.report.build import ReportOptions

            self.report = finish(self._at, ReportOptions(price_per_gpu_hour=self.price, gpus=self.gpus),
                                 trackers=self.trackers, shown=self.folder)

    def step(self) -> None:
        step()

    @contextlib.contextmanager
    def eval(self) -> Iterator[None]:
        with _span("eval", "gpudoctor.profile.eval"):
            yield

    @contextlib.contextmanager
    def checkpoint(self) -> Iterator[None]:
        with _span("checkpoint", "gpudoctor.profile.checkpoint"):
            yield


_last_end: float | None = None  # when this process's last profile() ended (a Trainer callback's too)
INTERACTIVE = ("an interactive session (a notebook or a REPL): the time before the training began is not counted "
               "as startup")
AFTER_LAST = "this process was profiled before: startup counts from the end of its last profiled training"


def _session_start() -> tuple[float, str | None]:
    """Where this recording's startup begins, and why where that is not the process's start.

    A script's imports and setup before its training are startup: they count from the process's
    start. A notebook kernel or a REPL lived before the training for reasons of its own (hours of
    cells), and a process that trains twice did the first training before the second: counted
    from the process's start, either would read as startup that the training never had.
    """
    if _interactive():
        return time.time(), INTERACTIVE
    born = started_at(os.getpid()) or psutil.Process().create_time()
    if _last_end is not None and _last_end > born:
        return _last_end, AFTER_LAST
    return born, None


def _interactive() -> bool:
    """A REPL (``sys.ps1`` is set while one runs) or a running IPython shell or Jupyter kernel (the
    test tqdm and transformers use: a script that merely imported IPython has no shell)."""
    if hasattr(sys, "ps1"):
        return True
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    try:
        return callable(get_ipython) and get_ipython() is not None
    except Exception:  # whatever IPython does, the training goes on; counted as a script
        return False


def step() -> None:
    """Mark the end of a training step (for loops that do not use torch.optim)."""
    th = hooks.active_torch_hooks()
    if th is not None:
        th.explicit_step()


@contextlib.contextmanager
def _span(category: str, name: str) -> Iterator[None]:
    """The user's block runs exactly once, outside the guard; its exceptions go on untouched."""
    began = _span_begin(category)
    try:
        yield
    finally:
        if began is not None:
            _span_end(category, name, began)


@guarded("profile markers", vital=True)
def _span_begin(category: str) -> tuple[float, float] | None:
    if hooks.writer() is None or patch.depth(category):
        return None
    patch._enter(category)
    return (time.time(), time.perf_counter())


@guarded("profile markers", vital=True)
def _span_end(category: str, name: str, began: tuple[float, float]) -> None:
    patch._leave(category)
    w = hooks.writer()
    if w is not None:
        t0, p0 = began
        w.emit({"k": "span", "c": category, "t0": t0, "dt": time.perf_counter() - p0, "name": name})
