"""Stack samples from outside: py-spy in back-to-back windows over the whole process tree.

Why windows of ``py-spy record`` rather than one long recording or repeated
``py-spy dump``: ``record`` writes nothing until it ends, and ``dump`` pays
~25 ms of CPU per call; a 4 s window at 20 Hz costs ~20 ms per process and its
samples reach the run folder (and the live view) a few seconds later. Each
window samples the Python processes of the tree alive at its start, so ranks
and DataLoader workers that come and go are followed.
``--nonblocking`` reads the patient's memory without stopping it (py-spy's
pausing mode cost ~17% of step throughput at 100 Hz, see issue 3).

A hooked process and its workers are left out (the analysis reads only the
hooks' events for them), so once every process is hooked no py-spy runs.
py-spy runs at nice 19 with idle I/O, never ``SCHED_IDLE`` (:func:`gpudoctor.processes.priority.sampler_nice`:
an idle-class sampler would only see the patient when a core idles, a biased sample); its CPU
seconds are counted from ``wait4`` (``cpu_s``) for meta.json.

Each window adds one row per process to ``samples/stacks.jsonl`` (format in
:mod:`gpudoctor.analysis.sampled`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.analysis.sampled import Code
from gpudoctor.attach import scratch, targets
from gpudoctor.attach.classify import Frame, classify
from gpudoctor.attach.lock import pid_alive
from gpudoctor.common.errors import UserError
from gpudoctor.processes import childpy, priority
from gpudoctor.processes.proctree import ProcTree
from gpudoctor.samplers.base import RowWriter

# "Process 12 Thread 12 ..." with --subprocesses, "Thread 12 ..." without
_PROFILE = re.compile(r"(?:Process (\d+) )?Thread (\d+)")
MAX_SAME_ERROR = 3


def pyspy_path() -> str | None:
    """py-spy next to this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else childpy.which("py-spy")


class StackSampler:
    """Runs py-spy windows on a daemon thread until :meth:`stop` or the root process is gone."""

    def __init__(self, root_pid: int, writer: RowWriter, rate_hz: float = 20.0, window_s: float = 4.0,
                 describe: Callable[[int], dict[str, Any]] | None = None) -> None:
        self.root_pid = root_pid
        self.writer = writer
        self.rate_hz = rate_hz
        self.window_s = window_s
        self.describe = describe or (lambda pid: {})
        self.errors: list[str] = []
        self.samples = 0
        self.cpu_s = 0.0  # py-spy's own CPU seconds, all windows
        self.thread_cpu_s = 0.0  # this sampler's thread: spawning, reading and classifying
        self.idle = False  # the doctor went idle once hooked (py-spy stays nice 19: see sampler_nice)
        self.hooked: set[int] = set()  # their stacks are not needed (the hooks measure them): not sampled
        self._error_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._described: dict[int, dict[str, Any]] = {}
        self._tree = ProcTree(root_pid)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # py-spy's output: in the doctor's private scratch folder (removed by the next attach if we die)
        self._tmp = Path(tempfile.mkdtemp(prefix="stacks-", dir=scratch.session_dir()))
        self._exe = pyspy_path()

    def start(self) -> None:
        if self._exe is None:
            self.errors.append("py-spy is not installed (pip install py-spy), so no stack samples were taken")
            return
        self._thread = threading.Thread(target=self._run, name="gpudoctor-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the current window early (py-spy writes what it has on SIGINT) and join."""
        self._stop.set()
        with self._lock:
            for proc in self._procs.values():
                if proc.returncode is None:  # not poll(): _reap waits for it, with its CPU time
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGINT)
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.writer.flush()
        self.writer.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def mark_hooked(self, pid: int) -> None:
        """``pid`` is hooked: its stacks (and its workers') are not needed from now on, so the
        window under way ends early for them (py-spy writes what it has on SIGINT) rather than
        sampling a patient that keeps every core busy for the rest of the window."""
        with self._lock:
            self.hooked.add(pid)
            for sampled, proc in self._procs.items():
                if proc.returncode is None and _is_or_under(sampled, pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGINT)

    def _run(self) -> None:
        priority.name_thread("gd-stacks")
        try:
            while not self._stop.is_set() and pid_alive(self.root_pid):
                if not self._window():
                    if self._gave_up():
                        return
                    self._stop.wait(1.0)
                elif not self._procs:  # nothing to sample (every process hooked): look again later
                    self._stop.wait(self.window_s)
        finally:
            self.thread_cpu_s = time.thread_time()

    def _window(self) -> bool:
        """One py-spy per Python process of the tree, all for the same few seconds."""
        rate_hz = self.rate_hz
        t0 = time.time()
        with self._lock:
            if self._stop.is_set():
                return True
            self._procs = {pid: self._spawn(pid, rate_hz) for pid in self._python_tree()}
        for pid in self._procs:  # asked once, while the process is alive
            if pid not in self._described:
                self._described[pid] = self.describe(pid)
        errors = {pid: self._reap(proc) for pid, proc in self._procs.items()}
        t1 = time.time()
        rows = []
        for pid in self._procs:
            out = self._tmp / f"{pid}.json"
            try:
                profile = json.loads(out.read_text())
            except (OSError, json.JSONDecodeError):
                if pid == self.root_pid and pid_alive(pid) and not self._stop.is_set():
                    self._error(_last_line(errors[pid].decode("utf-8", "replace")))
                continue  # a worker that exited mid-window leaves no output
            rows += window_rows(profile, t0, t1, rate_hz, pid)
        for row in rows:
            row.update(self._described.get(row["pid"], {}))
            self.samples += len(row["codes"])
            self.writer.write(row)
        self.writer.flush()
        return bool(rows) or not self._procs

    def _spawn(self, pid: int, rate_hz: float) -> subprocess.Popen[bytes]:
        assert self._exe is not None
        out = self._tmp / f"{pid}.json"
        out.unlink(missing_ok=True)
        argv = [self._exe, "record", "--pid", str(pid), "--rate", f"{rate_hz:g}",
                "--duration", f"{max(1, round(self.window_s))}", "--nonblocking", "--idle",
                "--format", "speedscope", "--output", str(out)]
        # Own session: a Ctrl-C meant for the doctor must not end the window unrecorded.
        # Killed with the doctor: a SIGKILLed doctor must leave no py-spy behind.
        # From the normal-priority spawner, then nice 19 (see priority.sampler_nice): never SCHED_IDLE.
        return priority.popen_normal(argv, then=functools.partial(_pyspy_preexec, os.getpid()),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                     env=childpy.doctor_env())

    def _reap(self, proc: subprocess.Popen[bytes]) -> bytes:
        """Wait for one py-spy and add its CPU seconds to :attr:`cpu_s`; returns its stderr."""
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stderr.close()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except ChildProcessError:  # reaped elsewhere: its CPU is not known
            proc.wait()
            return err
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s += usage.ru_utime + usage.ru_stime
        return err

    def _python_tree(self) -> list[int]:
        """The root and its descendants that run Python.

        One py-spy per process rather than ``--subprocesses``: following children
        makes py-spy rescan /proc all the time, ~3x the CPU of separate samplers.
        """
        try:
            tree = self._tree.refresh()
        except psutil.Error:
            return []
        hooked = set(self.hooked)
        if hooked:  # a hooked process and its DataLoader workers: the analysis never reads their samples
            tree = [proc for proc in tree if not _under(proc, hooked)]
        return [proc.pid for proc in tree if _runs_python(proc.pid)]

    def _error(self, message: str) -> None:
        self._error_counts[message] = self._error_counts.get(message, 0) + 1
        if message not in self.errors:
            self.errors.append(message)

    def _gave_up(self) -> bool:
        return any(n >= MAX_SAME_ERROR for n in self._error_counts.values())


def _pyspy_preexec(parent: int) -> None:
    priority.sampler_nice()
    scratch.die_with_parent(parent)


def window_rows(profile: dict[str, Any], t0: float, t1: float, rate_hz: float, root_pid: int) -> list[dict[str, Any]]:
    """One row per process: the codes of its main thread's samples, in order."""
    frames = profile.get("shared", {}).get("frames", [])
    cache: dict[tuple[int, ...], str] = {}
    rows = []
    for prof in profile.get("profiles", []):
        m = _PROFILE.match(prof.get("name", ""))
        pid = int(m.group(1) or root_pid) if m else None
        if m is None or int(m.group(2)) != pid:  # only each process's main thread
            continue
        codes = []
        worker = False
        for sample in prof.get("samples", []):
            key = tuple(sample)
            code = cache.get(key)
            if code is None:
                code = cache[key] = classify(_frames(frames, key))
            codes.append(code)
            worker = worker or code in (Code.WORKER_FETCH, Code.WORKER_IDLE)
        if codes:
            rows.append({"t": t0, "t1": t1, "pid": pid, "role": "worker" if worker else "main",
                         "rate_hz": rate_hz, "codes": "".join(codes)})
    return rows


def _frames(frames: list[dict[str, Any]], sample: tuple[int, ...]) -> list[Frame]:
    out = []
    for i in sample:
        f = frames[i] if 0 <= i < len(frames) else {}
        name, file = str(f.get("name", "")), str(f.get("file") or "")
        if not file and (name.startswith("process ") or name.startswith("thread (")):
            continue  # the --subprocesses / thread root frames
        out.append((name, file))
    return out


def _under(proc: psutil.Process, pids: set[int]) -> bool:
    """``proc`` is one of ``pids`` or descends from one."""
    try:
        return proc.pid in pids or any(p.pid in pids for p in proc.parents())
    except psutil.Error:
        return False


def _is_or_under(pid: int, root: int) -> bool:
    if pid == root:
        return True
    try:
        return _under(psutil.Process(pid), {root})
    except psutil.Error:
        return False


def _runs_python(pid: int) -> bool:
    try:
        return targets.is_python(pid)
    except UserError:  # not ours to inspect: py-spy could not either
        return False


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"py-spy: {lines[-1]}" if lines else "py-spy exited without output"
