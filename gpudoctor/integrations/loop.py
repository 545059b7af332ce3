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
        # The process started before us: count its imports and setup as startup too.
        self._recorder.start(os.getpid(), started_at(os.getpid()) or psutil.Process().create_time())
        hooks.install(folder.root)
        self.folder, self._at = folder.root, folder.at
        self._owner = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Returns None: an exception of the user's loop goes on, untouched.
        if not self._owner:
            return
        self._owner = False
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
