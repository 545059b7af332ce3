"""One ``gpudoctor attach``: from a live pid to a finished run folder.

Order matters for the patient: the outside samplers start first (they cannot
hurt it), then the hooks go in (a debugger stop of tens of milliseconds per
process), and on the way out the hooks are removed before the samplers stop,
so the process is left exactly as it was found even when the doctor is
interrupted. New ranks that appear while attached (a launcher still starting)
get hooks too.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.attach import budget, inject, stoppable, targets
from gpudoctor.attach.lock import pid_alive
from gpudoctor.attach.stacks import StackSampler
from gpudoctor.attach.window import AttachRecord, TargetRecord
from gpudoctor.common.errors import UserError
from gpudoctor.launch.recorder import Recorder, RecorderOptions, default_out, doctor_cpu
from gpudoctor.processes import priority, waker
from gpudoctor.processes.proctree import ProcTree
from gpudoctor.recording.store import RunFolder

POLL_S = 0.2
HOOKED_POLL_S = 1.0  # every target hooked or refused: nothing waits on a status file, the doctor sleeps longer
RESCAN_S = 2.0
HOOKED_RATE_DIVISOR = 4  # with exact in-process figures, stack samples are only a cross-check
HOOKED_WINDOW_S = 12.0  # ... in longer windows: a py-spy window costs ~50 ms of CPU to start, whatever its rate


@dataclass
class AttachOptions:
    pid: int
    out: Path | None = None
    duration_s: float | None = None
    interval_s: float = 0.5
    price_per_gpu_hour: float | None = None
    gpus: int | None = None
    inject: bool = True
    sample_rate_hz: float = 20.0
    window_s: float = 4.0
    nvml_binding: Any = None
    doctor_priority: dict[str, str] | None = None  # what gpudoctor.processes.priority gave this doctor
    stacks_when_hooked: bool = False  # keep sampling a hooked process's stacks (no figure needs them)


@dataclass
class _Stop:
    reason: str | None = None
    signals: int = 0
    event: threading.Event = field(default_factory=threading.Event)

    def __call__(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self.reason = self.reason or ("interrupted" if signum == signal.SIGINT else "terminated")
        self.event.set()


class AttachSession:
    def __init__(self, options: AttachOptions, root: psutil.Process) -> None:
        self.options = options
        self.root = root
        self.folder = RunFolder(options.out or default_out("attach")).create()
        self.control = self.folder.at / "attach"  # through the folder's descriptor (RunFolder.at)
        self.record = AttachRecord(attach_time=time.time(), root_start_time=targets.start_time(root),
                                   inject=options.inject)
        self.stop = _Stop()
        self._injecting: dict[int, threading.Thread] = {}
        self._ending = threading.Event()  # injections still waiting for a safe moment give up
        self._launcher = targets.is_launcher(root)
        self.procs = ProcTree(root.pid)  # rescanned every RESCAN_S under a launcher: only new pids are read
        self._lock = threading.Lock()
        self.recorder = Recorder(self.folder, RecorderOptions(
            mode="attach", command=_cmdline(root), interval_s=options.interval_s,
            price_per_gpu_hour=options.price_per_gpu_hour, gpus=options.gpus,
            nvml_binding=options.nvml_binding, doctor_priority=options.doctor_priority))
        self.stacks = StackSampler(root.pid, self.folder.appender("samples/stacks.jsonl"),
                                   rate_hz=options.sample_rate_hz, window_s=options.window_s,
                                   describe=targets.describe)
        # A root doctor beside another user's training: that user writes attach/ and events/.
        self.patient_ids = _other_user(root)
        self.status_owner = self.patient_ids[0] if self.patient_ids else os.geteuid()
        self.bootstrap = inject.write_bootstrap(self.control, self.folder.root, self.patient_ids)
        if self.patient_ids:
            self.folder.share(*self.patient_ids, ("attach", "events"))
        self.recorder.options.events_owner = self.status_owner
        self.live_cpu_s = 0.0  # the live view's CPU on the main thread
        self._waker: waker.Waker | None = None  # keeps the window's end and Ctrl-C on time once idle

    # -- the session ----------------------------------------------------------------
    def run(self, view: Any = None) -> AttachRecord:
        """Sample, inject, wait for the end, detach; returns what happened (also in meta.json)."""
        self.recorder.prepare()
        self.recorder.start(self.root.pid, self.record.attach_time)
        self.stacks.start()
        old = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.options.doctor_priority is not None:  # started now: spawned once idle, it came late or not at all
            self._waker = waker.start(self._deadline(), (self.root.pid,))
        try:
            self._watch(view)
        finally:
            self._unidle()
            self.stacks.stop()
            self._detach()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self._finish()
        return self.record

    def _deadline(self) -> float | None:
        return self.record.attach_time + self.options.duration_s if self.options.duration_s else None

    def _watch(self, view: Any) -> None:
        deadline = self._deadline()
        next_scan = next_tick = 0.0
        while True:
            now = time.time()
            if not pid_alive(self.root.pid):
                self.record.ended_by = "exit"
                break
            if self.stop.reason:
                self.record.ended_by = self.stop.reason
                break
            if deadline is not None and now >= deadline:
                self.record.ended_by = "duration"
                break
            if now >= next_scan:
                next_scan = now + RESCAN_S
                self._scan()
            self._poll_status()
            if view is not None and now >= next_tick:
                next_tick = now + 1.0
                view.state.source = self.record.source()
                t0 = time.thread_time()
                view.tick()
                self.live_cpu_s += time.thread_time() - t0
            wait = POLL_S if self._pending() else HOOKED_POLL_S
            self.stop.event.wait(wait if deadline is None else max(0.0, min(wait, deadline - time.time())))
        self.record.end_time = time.time()

    def _pending(self) -> bool:
        """Something waits on a short poll: no target yet, or one not yet installed nor refused."""
        if not self.options.inject:
            return False
        recs = list(self.record.targets.values())
        return not recs or any(r.installed_at is None and not r.error for r in recs)

    # -- hooks in ---------------------------------------------------------------------
    def _scan(self) -> None:
        """Hook training processes not seen before (ranks of a launcher appear late)."""
        if not self.options.inject or (self.record.targets and not self._launcher):
            return
        for t in targets.training_targets(self.root, self.procs):
            with self._lock:
                if t.pid in self.record.targets:
                    continue
                rec = self.record.targets[t.pid] = TargetRecord(pid=t.pid, rank=t.rank, create_time=t.create_time)
            thread = threading.Thread(target=self._inject_one, args=(rec,), daemon=True)
            self._injecting[t.pid] = thread
            thread.start()

    def _inject_one(self, rec: TargetRecord) -> None:
        requested = rec.requested_at = time.time()

        def when_stoppable() -> None:
            """gdb stops the whole process: first wait for a moment that cannot break it (see stoppable)."""
            def waiting(hazard: stoppable.Hazard) -> None:
                rec.waiting_for = hazard.reason

            hazard = stoppable.wait_until_stoppable(rec.pid, stoppable.distributed(targets.environ(rec.pid)),
                                                    self._ending, waiting)
            rec.waited_s, rec.waiting_for = round(time.time() - requested, 3), None
            if hazard is not None:
                raise inject.InjectError(f"not stopped for injection: {hazard.reason}, until the session ended "
                                         "(a debugger stop then can break a rank's connection to its store)")

        refused = self._foreign(rec.pid)
        if refused:
            rec.error = refused
            return
        try:
            done = self._tries(rec, when_stoppable)
        except inject.InjectError as exc:
            rec.error = str(exc) + (f" ({rec.tries} tries)" if rec.tries > 1 else "")
            return
        rec.queued_s = round(time.time() - requested, 3)
        rec.method, rec.gdb_s = done.method, done.gdb_s

    def _tries(self, rec: TargetRecord, before_stop: Any) -> inject.Injection:
        """Inject, each try's time limit scaled to the machine as seen just before it (see budget).

        A try that ran out of time queued nothing: the next gets a budget measured afresh, unless
        the session is ending.
        """
        while True:
            seen = budget.measure(rec.pid)
            rec.tries += 1
            rec.try_budget_s = seen.seconds(budget.INJECT_BASE_S)
            rec.budget_factor, rec.load_per_core, rec.run_delay_share = (seen.factor, seen.load_per_core,
                                                                         seen.run_delay_share)
            try:
                return inject.inject(rec.pid, self.bootstrap, timeout_s=rec.try_budget_s, before_stop=before_stop)
            except inject.InjectTimeout:
                if rec.tries >= budget.MAX_TRIES or self._ending.is_set():
                    raise

    def _foreign(self, pid: int) -> str | None:
        """Why ``pid`` must not run the bootstrap: it is not the user who owns attach/.

        The bootstrap and attach/ belong to the patient's user; a process of any other user in
        the tree (a setuid helper, say) would run code that user can change.
        """
        if self.patient_ids is None:
            return None  # attach/ is the doctor's own: nothing there another user can change
        owner = self.patient_ids[0]
        try:
            uid = psutil.Process(pid).uids().effective
        except psutil.Error:
            return None  # gone, or not ours to see: the injection says why
        if uid == owner:
            return None
        return (f"pid {pid} runs as uid {uid}, not as uid {owner} who owns the attach folder; its hooks "
                "were not loaded (it would run code another user can change)")

    def _poll_status(self) -> None:
        for rec in list(self.record.targets.values()):
            if rec.method is None or rec.installed_at is not None or rec.error:
                continue
            status = inject.read_status(self.control, rec.pid, "installed", self.status_owner)
            if status is None:
                continue
            installed_at = _seconds(status.get("t"))
            if status.get("ok") is True and installed_at is not None:
                rec.installed_at = installed_at
                rec.underway = bool(status.get("underway"))
                rec.install_s = _seconds(status.get("install_s"))
                self.stacks.rate_hz = max(5.0, self.options.sample_rate_hz / HOOKED_RATE_DIVISOR)
                self.stacks.window_s = max(self.options.window_s, HOOKED_WINDOW_S)
                if not self.options.stacks_when_hooked:  # its figures come from the hooks now
                    self.stacks.mark_hooked(rec.pid)
                self._idle()
                # The live view reads the folder: give it the report's window already.
                self.recorder.meta["start_time"] = self.record.window_start(self.folder.at)
                self.folder.write_meta(self.recorder.meta)
            else:
                rec.error = f"the hooks failed to load in pid {rec.pid}: {str(status.get('error'))[:500]}"

    def _idle(self) -> None:
        """Hooked: from now on the doctor (threads, later py-spy windows) takes only idle cycles.

        Not once the window is over: an install first seen by the detach's own status poll (a
        Ctrl-C a moment after it) lowered the doctor again after :meth:`_unidle`, and beside two
        busy programs its report then took minutes (the idle main thread importing the HTML
        renderer 25 s after the Ctrl-C)."""
        if self.options.doctor_priority is None or self.stacks.idle or self._ending.is_set():
            return
        got = priority.lower_doctor()
        self.stacks.idle = True
        self.recorder.meta["doctor_priority"] = {
            **self.options.doctor_priority, "cpu": f"{got['cpu']} once hooked (before: "
            f"{self.options.doctor_priority['cpu']})", "io": f"{got['io']} once hooked"}

    def _unidle(self) -> None:
        """The window is over: the detach and the files go at normal priority again (where allowed).

        At idle priority beside a patient and other programs that keep every core busy, the
        doctor's detach and files took minutes (it polled the patient's confirmation a few times
        before its deadline and called a confirmed detach unconfirmed), and the training gains
        nothing from the wait: its hooks are coming out either way. Whatever it was lowered to
        (nice 10 before the hooks, idle once hooked), it goes back here, once, for the report too.
        """
        if self._waker is not None:
            self._waker.stop()
            self._waker = None
        if self.options.doctor_priority is not None:
            back = priority.restore_doctor()
            self.recorder.meta.setdefault("doctor_priority", dict(self.options.doctor_priority))["after_window"] = (
                "normal: SCHED_OTHER, nice 0" if back else "unchanged (going back needs CAP_SYS_NICE)")

    # -- hooks out --------------------------------------------------------------------
    def _detach(self) -> None:
        """Ask every hooked process to remove its hooks; wait a little for them to confirm."""
        self._ending.set()
        for pid, thread in self._injecting.items():  # a try under way finishes; no other starts
            thread.join(timeout=(self.record.targets[pid].try_budget_s or budget.INJECT_BASE_S) + 5)
        self._poll_status()
        with contextlib.suppress(OSError):  # the payload's watchdog also detaches when the doctor exits
            inject.request_detach(self.control)
        self.record.detach_time = time.time()
        # An install still in flight (queued on a main thread that had not run it yet) is waited
        # for too: it either installs and is detached by its watchdog, or sees the detach file first
        # and skips. Waiting only on confirmed installs left such a one's detach unknown.
        waiting = [r for r in self.record.targets.values() if r.method is not None and not r.error]
        deadline = time.time() + (0.5 if self.stop.signals > 1 else self._detach_wait_s(waiting))
        while waiting and time.time() < deadline:
            self._poll_status()
            for rec in list(waiting):
                status = inject.read_status(self.control, rec.pid, "detached", self.status_owner)
                if status is not None:
                    rec.detached = status.get("ok", True) is True
                    rec.uninstall_s = _seconds(status.get("uninstall_s"))
                    waiting.remove(rec)
                elif rec.error or not pid_alive(rec.pid) or (
                        rec.installed_at is None
                        and inject.read_status(self.control, rec.pid, "skipped", self.status_owner) is not None):
                    waiting.remove(rec)  # never installed, failed to, or exited: nothing left to remove
            if waiting:
                time.sleep(0.1)
        for rec in waiting:
            if rec.installed_at is not None:
                rec.detached = False if pid_alive(rec.pid) else None

    def _detach_wait_s(self, waiting: list[TargetRecord]) -> float:
        """How long the processes get to confirm: a loaded machine runs their watchdogs late."""
        if not waiting:
            return 0.0
        seen = budget.measure(waiting[0].pid, sample_s=0.1)
        self.record.detach_wait_s = seen.seconds(budget.DETACH_BASE_S)
        return self.record.detach_wait_s

    def _finish(self) -> None:
        self.record.stack_samples = self.stacks.samples
        self.record.stack_errors = list(self.stacks.errors)
        self.record.sample_rate_hz = self.options.sample_rate_hz
        self.recorder.stop(_status(self.record.ended_by), None)  # the patient's exit code is not ours to see
        self.recorder.meta.update(self.record.meta_fields(self.folder.at))
        self.recorder.meta["doctor_cpu_s"] = self._doctor_cpu()
        self.recorder.meta["attach"]["stacks_when_hooked"] = self.options.stacks_when_hooked
        self.folder.write_meta(self.recorder.meta)


    def _doctor_cpu(self) -> dict[str, float]:
        """CPU seconds by part: samplers, py-spy (its processes), the stacks thread, the live view, gdb."""
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # every py-spy and gdb, reaped by now
        children = kids.ru_utime + kids.ru_stime
        return doctor_cpu(self.recorder.sampler_cpu_s(), py_spy=self.stacks.cpu_s,
                          stacks_thread=self.stacks.thread_cpu_s, live_view=self.live_cpu_s,
                          gdb_and_other_children=max(0.0, children - self.stacks.cpu_s))


def _seconds(value: object) -> float | None:
    return round(float(value), 6) if isinstance(value, int | float) else None


def _other_user(root: psutil.Process) -> tuple[int, int] | None:
    """(uid, gid) of the patient when the doctor is root and the patient another user, else None."""
    try:
        uid, gid = root.uids().effective, root.gids().effective
    except psutil.Error:
        return None
    return (uid, gid) if os.geteuid() == 0 and uid != 0 else None


def _status(ended_by: str | None) -> str:
    return {"exit": "finished", "duration": "detached", "interrupted": "interrupted",
            "terminated": "interrupted"}.get(ended_by or "", "detached")


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        cmdline: list[str] = proc.cmdline()  # psutil: no stubs
        return cmdline
    except psutil.Error:
        return []


def open_session(options: AttachOptions) -> AttachSession:
    """Check the pid, refuse a non-Python process tree, and prepare the run folder."""
    root = targets.patient(options.pid)
    if not targets.is_python(root.pid) and not targets.training_targets(root):
        raise UserError(f"pid {root.pid} ({root.name()}) is not a Python process and starts none; "
                        "gpudoctor attach needs the training process (or its launcher / wrapper)")
    return AttachSession(options, root)
