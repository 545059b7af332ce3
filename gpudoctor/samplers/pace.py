"""Sample as often as the run's steps need, not faster: intervals that follow the step time.

Why: the samplers' figures (CPU, GPU busy, memory) are read per step or over many
steps; a 10 Hz sampler beside a 3 s step takes 30 samples a step where a few do,
and on a host whose cores the training keeps busy every tick comes out of the
patient. The step time comes from the step lines the hooks already write
(``events/<pid>.jsonl``), read incrementally (only new bytes, a few times a
minute; a line is parsed only to read the first and last step's time). A file
is opened only when it has grown, and never again once its process is gone: a
run whose DataLoader workers fork anew each epoch leaves a file per worker, and
a day of short epochs leaves thousands.

On a host with less than a whole core idle the host sampler also slows to one
tick a second: its idle priority then finds no core of its own, so each tick
runs by preempting the training, and a tick costs ~0.7 ms, ~0.7% of a core at
10 Hz, more when it preempts one of a thread pool's threads at a barrier. "Every
core busy" (>= 90%) was the first rule; DataLoader workers that fill the cores in
bursts keep a 2-core host at 75-95% busy, with a core's fifth idle on average
but rarely a whole one, and the sampler stayed at 10 Hz there. Nothing it
reports is lost: CPU, disk and per-process figures are counter differences
(exact over any interval) and the analysis weighs rows by the time they cover.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.processes.pids import pid_alive

SAMPLES_PER_STEP = 5.0  # at least this many samples per step, whatever the interval
MAX_INTERVAL_S = 2.0  # and never slower than this (a stall shorter than ~2 samples would vanish)
SATURATED_IDLE_CORES = 1.0  # fewer cores than this idle (every process counted, ours too): none is ours
SATURATED_INTERVAL_S = 1.0  # the host sampler's interval then
REFRESH_S = 5.0
MAX_READ = 4 << 20  # bytes per file per refresh: a flood of lines is skipped, not parsed
_STEP = b'"k":"step"'


class StepClock:
    """Seconds per step of the busiest process writing to ``events_dir`` (None before two steps)."""

    def __init__(self, events_dir: Path, owner: int | None = None, refresh_s: float = REFRESH_S) -> None:
        self.events_dir = events_dir
        self.owner = owner
        self.refresh_s = refresh_s
        self._offsets: dict[Path, int] = {}
        self._steps: dict[Path, tuple[float, float, int]] = {}  # first t, last t, steps
        self._done: set[str] = set()  # files read to their end whose process has exited
        self.opens = 0  # files opened, all refreshes (tests count them)
        self._next = 0.0
        self._value: float | None = None
        self._lock = threading.Lock()  # the host and GPU samplers share one clock

    def step_s(self) -> float | None:
        with self._lock:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + self.refresh_s
                self._read()
                rates = [(n, (t1 - t0) / (n - 1)) for t0, t1, n in self._steps.values() if n >= 2 and t1 > t0]
                self._value = max(rates)[1] if rates else None
            return self._value

    def _read(self) -> None:
        try:
            with os.scandir(self.events_dir) as listing:
                entries = [e for e in listing if e.name.endswith(".jsonl") and e.name not in self._done]
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            try:
                gone = not _alive(entry.name.removesuffix(".jsonl"))  # asked first: its last bytes are read below
                if entry.stat(follow_symlinks=False).st_size > self._offsets.get(path, 0):
                    self._read_one(path)
                if gone:
                    self._done.add(entry.name)  # its writer is gone and its lines are read: never again
            except (OSError, ValueError):  # a file being removed or refused: skip it this time
                continue

    def _read_one(self, path: Path) -> None:
        offset = self._offsets.get(path, 0)
        self.opens += 1
        with safefs.open_read(path, self.owner) as fh:
            fh.seek(offset)
            chunk = fh.read(MAX_READ)
        end = chunk.rfind(b"\n") + 1  # a line being written is read next time
        if end == 0:
            return
        self._offsets[path] = offset + end
        lines = [ln for ln in chunk[:end].splitlines() if _STEP in ln]
        if not lines:
            return
        first, last = _time(lines[0]), _time(lines[-1])
        t0, _, n = self._steps.get(path, (first, first, 0))
        self._steps[path] = (t0, last, n + len(lines))


def _alive(name: str) -> bool:
    """Is the process an events file is named after still running? (A name that is no pid: yes.)"""
    try:
        return pid_alive(int(name))
    except ValueError:
        return True


def _time(line: bytes) -> float:
    return float(json.loads(line)["t"])


class Pace:
    """A sampler's interval: ``base_s`` while steps are fast, longer beside slow steps, and at
    least :data:`SATURATED_INTERVAL_S` while the host's last tick found less than a core idle."""

    def __init__(self, base_s: float, clock: StepClock | None) -> None:
        self.base_s = base_s
        self.clock = clock
        self.idle_cores: float | None = None  # set by the host sampler after each tick

    def tell_host(self, busy_pct: float | None, n_cpus: int | None) -> None:
        """The host's last tick: its cores' busy share (100 = all) and how many there are."""
        self.idle_cores = None if busy_pct is None or not n_cpus else (100.0 - busy_pct) / 100.0 * n_cpus

    def interval_s(self) -> float:
        step = self.clock.step_s() if self.clock is not None else None
        interval = self.base_s if step is None else max(self.base_s, min(MAX_INTERVAL_S, step / SAMPLES_PER_STEP))
        if self.idle_cores is not None and self.idle_cores < SATURATED_IDLE_CORES:
            interval = max(interval, SATURATED_INTERVAL_S)
        return interval
