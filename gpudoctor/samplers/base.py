"""A background thread that samples something at a fixed rate and appends rows.

Samplers run beside the training job for its whole life, so a fault in one
sample must neither kill the thread silently nor flood the log: each distinct
error is kept once in ``errors`` (for an ``info`` finding) and sampling goes on.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Protocol

from gpudoctor.processes.priority import in_turn, name_thread, out_of_turn, start_in_turn

if TYPE_CHECKING:
    from gpudoctor.samplers.pace import Pace


class RowWriter(Protocol):
    """What a sampler writes to; :class:`gpudoctor.recording.JsonlAppender` is one."""

    def write(self, obj: dict[str, Any]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class Sampler:
    """Calls :meth:`sample` every ``interval_s`` on a daemon thread.

    Each row gets ``"t"`` (epoch seconds at the middle of its read) and ``"m"`` (the
    monotonic clock at the same moment: where the two part, the wall clock was stepped,
    :mod:`gpudoctor.recording.clock`) and goes to ``writer``. The middle, because a read
    spans the process tree and, at idle priority on a busy host, can be descheduled inside it:
    a row stamped at its start once held a tree read after the training's workers had exited,
    stamped before the training's last step ended. Subclasses implement
    :meth:`sample`; returning ``None`` skips a row.
    """

    name = "sampler"
    keeps_turn = False  # its ticks on time on a saturated host: nice 19 rather than SCHED_IDLE (priority.in_turn)

    def __init__(self, writer: RowWriter | None, interval_s: float = 0.1, pace: Pace | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.writer = writer
        self.interval_s = interval_s
        self.errors: list[str] = []
        self.rows_written = 0
        self.pace = pace  # when set, the interval follows the run's step time (see samplers.pace)
        self.cpu_s = 0.0  # this sampler thread's CPU seconds, once stopped
        self._seen_errors: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def sample(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"gpudoctor-{self.name}", daemon=True
        )
        if self.keeps_turn:  # from a normal thread: a doctor without CAP_SYS_NICE never leaves SCHED_IDLE
            start_in_turn(self._thread)
        else:
            self._thread.start()

    def stop(self) -> None:
        """Stop promptly, join, flush and close the writer; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()

    def tick(self) -> None:
        """Take one sample and write it, stamped at the middle of its read; errors are recorded,
        not raised."""
        t, m = time.time(), time.monotonic()
        try:
            row = self.sample()
            if row is not None:
                half = (time.monotonic() - m) / 2
                if self.writer is not None:
                    self.writer.write({"t": t + half, "m": round(m + half, 4), **row})
                self.rows_written += 1
        except Exception as exc:  # recorded in self.errors and reported by the caller
            self._record_error(exc)

    def _run(self) -> None:
        if self.keeps_turn:
            in_turn()
        # named once lowered: its name in /proc says the thread is what it will stay (a reader that
        # waits for the name read the host sampler between its nice and its I/O class once)
        name_thread(f"gd-{self.name}")
        try:
            self._loop()
        finally:
            self.cpu_s = time.thread_time()
            if self.keeps_turn:
                out_of_turn()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            if self.pace is not None:
                self.interval_s = self.pace.interval_s()
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (slow sample): skip, do not burst to catch up
                next_t = time.monotonic()
                delay = 0.0
            if self._stop.wait(delay):
                break

    def _record_error(self, exc: BaseException) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        where = (
            f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
        )
        msg = f"{self.name} sampler: {type(exc).__name__}: {exc}{where}"
        if msg not in self._seen_errors:
            self._seen_errors.add(msg)
            self.errors.append(msg)
