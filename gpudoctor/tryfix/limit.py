"""Stop the trial after S seconds of training: it runs the user's own command, which must not
write checkpoints or outputs for as long as the real run would.

The clock starts at the first training step, seen as the hooks' ``first_step`` (or ``step``)
event in the trial's run folder, so the interpreter's imports and the data preparation do
not eat the seconds being measured. Then the child's process group (DataLoader workers,
ranks) gets SIGINT, as Ctrl-C would, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.termtext import say

MARKERS = (b'"k":"first_step"', b'"k":"step"')
READ_CHUNK = 1 << 20
GRACE_S = 10.0  # after SIGINT, then after SIGTERM


class TrainingLimit:
    """``poll`` (from run's wait loop) stops the child ``seconds`` after its first training step,
    or ``startup_cap_s`` after launch when no step ever comes."""

    def __init__(self, events_dir: Path, seconds: float, startup_cap_s: float) -> None:
        self.events_dir = events_dir
        self.seconds = seconds
        self.startup_cap_s = startup_cap_s
        self.started = time.monotonic()
        self.training_from: float | None = None
        self.deadline: float | None = None
        self.stopped = False
        self.note: str | None = None
        self._offsets: dict[Path, int] = {}
        self._stage = 0
        self._stage_at = 0.0

    def poll(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        now = time.monotonic()
        if self.deadline is None:
            if self._training_started():
                self.training_from = now
                self.deadline = now + self.seconds
            elif now - self.started > self.startup_cap_s:
                self.note = f"no training step within {self.startup_cap_s:.0f} s of launch; trial stopped"
                self.deadline = now
        if self.deadline is not None and now >= self.deadline:
            self._stop(proc, now)

    def _stop(self, proc: subprocess.Popen[bytes], now: float) -> None:
        if self._stage and now - self._stage_at < GRACE_S:
            return
        sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(self._stage, 2)]
        if not self._stage:
            say(f"gpudoctor try: {self.seconds:g} s of training done; stopping the command (SIGINT to its "
                "process group; a traceback from it is expected)", file=sys.stderr)
        self.stopped = True
        self._stage += 1
        self._stage_at = now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _training_started(self) -> bool:
        """Whether any events file of the trial holds a step marker (read once, incrementally)."""
        try:
            paths = sorted(self.events_dir.glob("*.jsonl"))
        except OSError:
            return False
        for path in paths:
            offset = self._offsets.get(path, 0)
            try:
                with safefs.open_read(path, owner=os.geteuid()) as fh:
                    fh.seek(max(0, offset - 32))  # a marker may straddle two reads
                    chunk = fh.read(READ_CHUNK)
            except OSError:
                continue
            self._offsets[path] = max(0, offset - 32) + len(chunk)
            if any(marker in chunk for marker in MARKERS):
                return True
        return False
