"""Short torch.profiler windows: a few steps now and then, never the whole run.

The profiler costs far more than our hooks (and its first start can take a
second), so by default a window opens only once the run has trained for a
minute and lasts 5 steps. It cross-checks the hook-measured data wait against
the profiler's own ``enumerate(DataLoader)`` events and, on a GPU, measures
kernel busy time: there it repeats every 10 minutes. Without a GPU a window
only cross-checks the data wait the hooks measure anyway, and costs the patient
0.7-1.2 s of a busy CPU each time (``bench/profiler_window_cost.py``): once is enough.

``GPUDOCTOR_PROFILE_WINDOW`` overrides: ``off``, or ``START:LEN`` (steps).
No window opens while another profiler runs (the user's own): torch would end
theirs when ours closes.

Kineto logs ``USDT:… profiler_start`` / ``profiler_stop`` on the training's own stderr at
each window. Its log level is read once, when the process's first profiler starts: unless the
user set ``KINETO_LOG_LEVEL``, our windows start with it above USDT (:data:`QUIET_KINETO`) and
take it back out of the environment at once, so the training's output stays its own. (A
process whose own profiler ran first keeps the level it started with: torch prints there
whatever we do.)
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any

from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

FIRST_AFTER_S = 60.0
EVERY_S = 600.0
MIN_STEPS = 50
LENGTH_STEPS = 5
KINETO_LEVEL_ENV = "KINETO_LOG_LEVEL"
QUIET_KINETO = "6"  # above kineto's USDT (5): its profiler_start/stop lines are not printed


class ProfilerWindows:
    """Counts steps itself, so a window open when recording stops still closes on time."""

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.disabled = False
        self.forced: tuple[int, int] | None = None
        spec = os.environ.get("GPUDOCTOR_PROFILE_WINDOW", "").strip()
        if spec == "off":
            self.disabled = True
        elif spec:
            self.forced = _parse(spec)
        self._prof: Any = None
        self._steps = 0
        self._end_step = 0
        self._t0 = 0.0
        self._p0 = 0.0
        self._start_step = 0
        self._last_p: float | None = None
        self._wait_s = FIRST_AFTER_S

    @property
    def open(self) -> bool:
        return self._prof is not None

    @guarded("profiler windows")
    def on_step(self) -> None:
        if self.disabled:
            return
        self._steps += 1
        step = self._steps
        if self._prof is not None:
            if step >= self._end_step:
                self._finish(step)
            return
        if not self.writer.enabled:
            return  # recording stopped: open no new window
        now = time.perf_counter()
        if self.forced is not None:
            if step == self.forced[0] and not _someone_profiles():
                self._begin(step, self.forced[1])
            return
        if self._last_p is None:
            self._last_p = now
            return
        if step >= MIN_STEPS and now - self._last_p >= self._wait_s and not _someone_profiles():
            self._begin(step, LENGTH_STEPS)

    def _begin(self, step: int, length: int) -> None:
        torch = sys.modules["torch"]
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self._t0 = time.time()
        self._p0 = time.perf_counter()
        self._start_step = step
        self._end_step = step + length
        with _quiet_kineto():
            prof.__enter__()  # type: ignore[no-untyped-call]  # torch.profiler.profile: unannotated
        self._prof = prof  # only once it runs: a failed start leaves nothing to close

    def _finish(self, step: int) -> None:
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        dt = time.perf_counter() - self._p0
        dataloader_us = 0.0
        kernel_us = 0.0
        cuda = "cuda" in str(getattr(prof, "activities", "")).lower()
        for evt in prof.key_averages():
            if "DataLoader" in evt.key and "__next__" in evt.key:
                dataloader_us += evt.cpu_time_total
            if cuda:
                kernel_us += getattr(evt, "self_device_time_total", 0.0) or 0.0
        self.writer.emit(
            {
                "k": "profiler",
                "t0": self._t0,
                "dt": dt,
                "steps": step - self._start_step,
                "dataloader_s": dataloader_us / 1e6,
                "cuda_kernel_s": kernel_us / 1e6 if cuda else None,
            }
        )
        self._last_p = time.perf_counter()
        self._wait_s = EVERY_S if cuda else math.inf  # without kernels to time, the first window said it all

    def stop(self) -> None:
        """Close an open window (detach, uninstall); never raises, whatever the hooks' state."""
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.__exit__(None, None, None)


@contextlib.contextmanager
def _quiet_kineto() -> Any:
    """``KINETO_LOG_LEVEL`` above USDT while kineto reads it, unless the user set it; then gone."""
    if KINETO_LEVEL_ENV in os.environ:
        yield
        return
    os.environ[KINETO_LEVEL_ENV] = QUIET_KINETO
    try:
        yield
    finally:
        os.environ.pop(KINETO_LEVEL_ENV, None)


def _parse(spec: str) -> tuple[int, int] | None:
    start, _, length = spec.partition(":")
    try:
        return (int(start), int(length or LENGTH_STEPS))
    except ValueError:
        print(f"gpudoctor: GPUDOCTOR_PROFILE_WINDOW={spec!r} is neither 'off' nor START:LEN; "
              "using the default windows", file=sys.stderr)
        return None


def _someone_profiles() -> bool:
    """True while a profiler is already on (the user's own): a window of ours would end theirs."""
    torch = sys.modules["torch"]
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))
