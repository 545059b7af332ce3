"""Launch a training command under the recorder, wait for it, and report: ``run``'s engine.

``gpudoctor run``, ``try`` and ``replay`` all start their command here. The child gets our ``_inject`` folder first on PYTHONPATH, so every Python
process it starts (ranks, workers) loads the in-process hooks through
``sitecustomize``; the doctor samples host and GPUs from outside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpudoctor.analysis import Analysis
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.core.schema import Report
from gpudoctor.launch import length_cost, warm_compute
from gpudoctor.launch.recorder import Recorder, RecorderOptions, child_env, default_out
from gpudoctor.pipeline import conclude
from gpudoctor.processes import priority, waker
from gpudoctor.processes.pids import ExitWaiter
from gpudoctor.recording.store import RunFolder
from gpudoctor.render.terminal import print_summary
from gpudoctor.report.build import Diagnosis, ReportOptions


class _Interrupts:
    """First Ctrl-C: let the child stop itself. Second: terminate it, then kill."""

    def __init__(self, group: bool = False) -> None:
        self.count = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.group = group  # the child leads its own process group: Ctrl-C reaches it through us

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if signum == signal.SIGTERM:
            _signal(proc, signal.SIGTERM, self.group)
        elif self.count == 1:
            if self.group:
                _signal(proc, signal.SIGINT, True)
            say("\ngpudoctor: interrupted; waiting for the training process to stop "
                "(Ctrl-C again to terminate it). The report will cover what was recorded.", file=sys.stderr)
        else:
            say("gpudoctor: terminating the training process; writing the report from what was recorded.",
                file=sys.stderr)
            _signal(proc, signal.SIGTERM, self.group)


def _signal(proc: subprocess.Popen[bytes], sig: int, group: bool) -> None:
    """Send ``sig`` to the child, or to its whole process group (workers, ranks) when it leads one."""
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


class View(Protocol):
    """What the terminal shows while the child runs (``run``'s panel, ``try``'s progress line)."""

    def start(self) -> None: ...

    def tick(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Launched:
    """What :func:`run` gives back: the command's exit code, the run folder and, when a report was
    built, the report with its analysis and findings (``try`` plans from them: one analysis a run)."""

    code: int
    folder: Path
    diagnosis: Diagnosis | None

    @property
    def report(self) -> Report | None:
        return self.diagnosis.report if self.diagnosis is not None else None


class Limit(Protocol):
    """Stops a child that leads its own process group when its time is up (``gpudoctor try``)."""

    stopped: bool  # it stopped the child (the run is then "interrupted", not "crashed")

    def poll(self, proc: subprocess.Popen[bytes]) -> None: ...


@dataclass(frozen=True)
class RunSpec:
    """One command to run under the doctor: what ``run``, ``try`` and ``replay`` ask of :func:`run`."""

    command: list[str]
    out: Path | None = None  # the run folder; None: a new one under reports/
    interval_s: float = 0.1  # the samplers' period
    price_per_gpu_hour: float | None = None
    gpus: int | None = None
    price_source: str | None = None  # where the price came from, when not --price-per-gpu-hour
    mode: str = "run"  # what meta.json and the report call the run (run, try, replay)
    as_json: bool = False  # the report alone on stdout; the command's own stdout goes to stderr
    summary: bool = True  # False: no summary printed
    shown_command: list[str] | None = None  # what the report shows as the command (replay runs a worker)
    extra_env: dict[str, str] | None = None
    # the child leads its own process group and ``limit.poll`` may stop it (signals then reach the
    # group, DataLoader workers included)
    limit: Limit | None = None
    trackers: bool = False  # add the figures to the training's tracker runs (docs/trackers.md)
    # made from the run folder once the child runs, ticked about once a second from the wait,
    # stopped before the report is said (None: nothing shown while it runs)
    view: Callable[[Path], View] | None = None
    nvml_binding: Any = None  # tests: a fake NVML at the binding boundary
    # why nothing is timed once the training exited (the model at other row widths, the compute
    # back to back: up to a minute of this machine, GPU time on a GPU); None: they are timed
    untimed: str | None = None


TRIAL_UNTIMED = "a trial is measured, not predicted"
NO_TIMING = "--no-timing"


def not_timed(why: str) -> str:
    """The report's note where a timing was wanted after the training and none was run."""
    return (f"nothing timed after the training ({why}): a padding fix is predicted from the recorded steps "
            "or FLOPs, a fix that removes a batch build at the compute as measured")


def run(spec: RunSpec) -> Launched:
    """Run ``spec.command`` under the doctor; returns its exit code (never the doctor's trouble: a
    recording or report that failed is said on stderr), the report with the analysis and findings
    it was built from (None if none) and the folder."""
    command, limit = spec.command, spec.limit
    if not command:
        raise UserError("no command to run; usage: gpudoctor run [OPTIONS] -- python train.py")
    _startable(command[0], (spec.extra_env or {}).get("PATH", os.environ.get("PATH", os.defpath)))
    root = spec.out or default_out(spec.mode)
    existed = root.exists()
    folder = RunFolder(root).create()
    recorder = Recorder(folder, RecorderOptions(mode=spec.mode, command=spec.shown_command or command,
                                                interval_s=spec.interval_s, price_per_gpu_hour=spec.price_per_gpu_hour,
                                                price_source=spec.price_source, gpus=spec.gpus,
                                                nvml_binding=spec.nvml_binding))
    recorder.prepare()
    env = child_env(folder.root)
    if spec.extra_env:
        env.update(spec.extra_env)
    handler = _Interrupts(group=limit is not None)
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.time()
    try:
        # From a normal-priority thread: a doctor lowered by an earlier run (try's trials) must not pass it on
        priority.start_normal_spawner()
        # --json: the report alone on stdout, for a program to parse; the command's own stdout goes to stderr
        proc = priority.popen_normal(command, env=env, process_group=0 if limit is not None else None,
                                     stdout=2 if spec.as_json else None)
    except (FileNotFoundError, PermissionError) as exc:  # found, yet not startable (a script's #! names no program)
        _restore(old)
        _discard(folder, existed)
        raise UserError(f"cannot start {command[0]!r}: {exc.strerror}; check the command after -- (a script "
                        "needs a working #! line, or run it through its interpreter)",
                        127 if isinstance(exc, FileNotFoundError) else 126) from None
    handler.proc = proc
    # The child is spawned at normal priority; from here the doctor takes only idle cycles.
    wake = waker.start(None, (proc.pid,))  # the child's end and Ctrl-C reach the idle doctor on time
    recorder.options.doctor_priority = priority.lower_doctor()
    recorder.start(proc.pid, start)
    shown = spec.view(folder.at) if spec.view is not None else None
    try:
        if shown is not None:
            shown.start()
        code = _wait(proc, handler, limit, shown.tick if shown is not None else None)
    finally:
        if shown is not None:
            shown.stop()
        _restore(old)
        if wake is not None:
            wake.stop()
        priority.restore_doctor()  # where allowed (root): a process that goes on is not left idle
    stopped = handler.count or (limit is not None and limit.stopped)
    status = "finished" if code == 0 else ("interrupted" if stopped else "crashed")
    recorder.stop(status, code)
    try:
        diagnosis = _report(folder, spec)
    except OSError as exc:  # --out filled up or vanished: the training itself is not at fault
        error = recorder.write_error or exc
        say(f"gpudoctor: could not write to --out {folder.root} ({error.strerror or error}): the recording "
            f"stopped early and no report was written; the training exited with {code}. Free space or "
            "choose another --out", file=sys.stderr)
        return Launched(code, folder.root, None)
    except Exception as exc:  # UserError included: the recording is safe on disk; say how to re-render it
        say(f"gpudoctor: could not build the report ({exc!r}); the training exited with {code}; the "
            f"recording is kept in {folder.root}; re-render it with: gpudoctor report {folder.root} --debug",
            file=sys.stderr)
        return Launched(code, folder.root, None)
    if recorder.write_error is not None:
        say(f"gpudoctor: warning: writing to {folder.root} failed ({recorder.write_error.strerror}); "
            "the report covers what was recorded before that", file=sys.stderr)
    return Launched(code, folder.root, diagnosis)


def _startable(program: str, path: str) -> None:
    """Refuse a command that cannot start, before a run folder is made for it (none is left empty)."""
    if os.sep in program:
        if not os.path.exists(program):
            raise UserError(f"cannot start {program!r}: no such file; check the command after --", 127)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise UserError(f"cannot start {program!r}: not an executable file; make it executable or run it "
                            f"through its interpreter (gpudoctor run -- python {program})", 126)
    elif shutil.which(program, path=path) is None:
        raise UserError(f"cannot start {program!r}: no such command on PATH; check the command after -- "
                        "(e.g. gpudoctor run -- python train.py)", 127)
    found = program if os.sep in program else shutil.which(program, path=path)
    interpreter = _shebang(found) if found else None
    if interpreter and not os.path.exists(interpreter):
        raise UserError(f"cannot start {program!r}: its #! line names {interpreter}, which does not exist; "
                        "fix that line, or run the script through its interpreter", 127)


def _shebang(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names, or None (not a script, or unreadable)."""
    if not os.path.isfile(path):  # never open a FIFO or a device to read a line
        return None
    try:
        with open(path, "rb") as f:
            head = f.readline(256)
    except OSError:
        return None
    words = head[2:].decode(errors="replace").split() if head.startswith(b"#!") else []
    return words[0] if words else None


def _discard(folder: RunFolder, existed: bool) -> None:
    """Take back what :meth:`RunFolder.create` made for a command that never started."""
    for sub in (folder.samples_dir, folder.events_dir):
        with contextlib.suppress(OSError):
            sub.rmdir()  # empty: nothing was recorded
    if folder.previous is not None:  # the earlier recording it set aside goes back where it was
        previous = folder.at / folder.previous.name
        with contextlib.suppress(OSError):
            for item in previous.iterdir():
                item.rename(folder.at / item.name)
            previous.rmdir()
    if not existed:
        with contextlib.suppress(OSError):
            folder.root.rmdir()


WAIT_TICK_S = 1.0  # the doctor's main thread wakes this often while the training runs (0.5 s with a limit)


def _wait(proc: subprocess.Popen[bytes], handler: _Interrupts, limit: Limit | None = None,
          tick: Callable[[], None] | None = None) -> int:
    """Wait for the child (asleep in the kernel: :class:`ExitWaiter`); a second interrupt gives
    it 5 s before it is killed. ``tick``: called at each wake (the live view)."""
    exited = ExitWaiter(proc)
    deadline = None
    try:
        while True:
            if limit is not None:
                limit.poll(proc)
            code = exited.wait(0.5 if limit is not None else WAIT_TICK_S)
            if code is not None:
                return _exit_code(code)
            if tick is not None:
                tick()
            if handler.count >= 2 and deadline is None:
                deadline = time.monotonic() + 5.0
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
    finally:
        exited.close()


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _report(folder: RunFolder, spec: RunSpec) -> Diagnosis:
    options = ReportOptions(price_per_gpu_hour=spec.price_per_gpu_hour, gpus=spec.gpus, price_source=spec.price_source,
                            prepare=lambda a: _measure_after(a, folder.at, spec.untimed))
    diagnosis = conclude(folder.at, options, trackers=spec.trackers, shown=folder.root)
    if spec.summary:
        print_summary(diagnosis.report, folder.root, spec.as_json)
    return diagnosis


def _measure_after(a: Analysis, at: Path, untimed: str | None) -> str | None:
    """What only this machine can tell after the training exited: the model at other row widths,
    the compute back to back; their notes, where one failed (or, where one was wanted, why none was timed)."""
    if untimed is not None:
        return not_timed(untimed) if length_cost.job(a) is not None or warm_compute.job(a) is not None else None
    notes = [n for n in (length_cost.measure(a, at), warm_compute.measure(a, at)) if n]
    return "; ".join(notes) or None


def _restore(old: Mapping[signal.Signals, Any]) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
