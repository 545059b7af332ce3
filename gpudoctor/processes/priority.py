"""The doctor's own CPU and I/O priority: it takes only the cycles the patient leaves idle.

Why: on a host whose cores the training keeps busy (torch threads, DataLoader
workers), every cycle the doctor takes comes out of the patient, and torch's
thread pool loses more than its share when one of its threads is preempted.
So the doctor, its threads and py-spy run ``SCHED_IDLE`` (else nice 19) with
the idle I/O class. Two yield but keep their turn, at nice 19: py-spy (its samples
would fall only where the patient waits) and the host sampler's thread (:func:`in_turn`:
idle, on a saturated host its once-a-second tick came every 3-10 s and the memory line
went thin), started from a normal thread (:func:`start_in_turn`) so that a doctor that may not
leave ``SCHED_IDLE`` (no CAP_SYS_NICE) never puts it there.

On Linux these belong to a *thread*, and a new thread or child inherits its
creator's. Hence: :func:`lower_doctor` lowers every thread of the doctor and is
called after the training child is spawned (``run``); gdb, which holds the
patient stopped, must never wait behind an idle doctor, so it is spawned from
:func:`popen_normal`'s thread, kept at normal priority (an unprivileged process
cannot leave ``SCHED_IDLE``), and :func:`restore_normal` runs in its preexec too. What must
happen on time once the doctor is idle (its window's end, Ctrl-C) is kept by
:mod:`gpudoctor.processes.waker`, outside the GIL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

NICE_IDLE = 19
_IOPRIO_CLASS_SHIFT = 13
IOPRIO_CLASS_NONE, IOPRIO_CLASS_BE, IOPRIO_CLASS_IDLE = 0, 2, 3
_IOPRIO_WHO_PROCESS = 1
_SYS_IOPRIO = {"x86_64": (251, 252), "aarch64": (30, 31), "i686": (289, 290), "ppc64le": (273, 274)}
_PR_SET_NAME = 15
_POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}

_libc: Any = None
with contextlib.suppress(OSError, TypeError):  # the process's own symbols: find_library would spawn gcc by PATH
    _libc = ctypes.CDLL(None, use_errno=True)

_spawner: _Spawner | None = None
_in_turn: set[int] = set()  # native ids of the threads that keep their ticks in turn (in_turn)
IDLE_SWITCH_S = 0.1  # the GIL switch interval of an idle doctor (see lower_doctor)
_saved_switch_s: float | None = None  # the interval before lower_doctor, restored by restore_doctor


# -- one thread / process ------------------------------------------------------------
def _lower_thread(tid: int) -> tuple[str, str]:
    """Lower thread ``tid`` (0: the caller); returns (cpu, io) as said in meta.json."""
    cpu = "unchanged"
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, NICE_IDLE)  # the fallback, and harmless under SCHED_IDLE
        cpu = f"nice {NICE_IDLE}"
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        cpu = "SCHED_IDLE"
    io = "idle" if set_ioprio(tid, IOPRIO_CLASS_IDLE) else "unchanged"
    return cpu, io


def _turn_thread(tid: int) -> None:
    """Thread ``tid`` at nice 19 under SCHED_OTHER with idle I/O: it yields to the patient but is
    scheduled in turn; leaving SCHED_IDLE needs CAP_SYS_NICE (root) or RLIMIT_NICE, else it stays."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, NICE_IDLE)
    set_ioprio(tid, IOPRIO_CLASS_IDLE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def in_turn() -> None:
    """The calling thread keeps its ticks on a saturated host: nice 19, not ``SCHED_IDLE``, in a
    doctor lowered by :func:`lower_doctor` (never in the training's own process: the Python API).
    For the host sampler: idle, on a host whose cores the training and other programs keep busy,
    it got a tick every 3-10 s where it asked for one a second (a memory line of 7 rows where 8
    draw one). At nice 19 a tick (~1 ms, once a second there) still yields to the patient, as
    py-spy does (:func:`sampler_nice`). :func:`lower_doctor` keeps such a thread so;
    :func:`out_of_turn` when it ends. Started by :func:`start_in_turn`, the thread is already
    ``SCHED_OTHER`` where the doctor could not leave ``SCHED_IDLE``."""
    tid = threading.get_native_id()
    _in_turn.add(tid)
    if _saved_switch_s is None:  # not a lowered doctor
        return
    _turn_thread(tid)


def start_in_turn(thread: threading.Thread) -> None:
    """Start ``thread`` (one that calls :func:`in_turn`) from :func:`popen_normal`'s thread once
    the doctor is lowered: a new thread takes its creator's policy, and a doctor without
    CAP_SYS_NICE (RLIMIT_NICE 0: any user's default) may never leave ``SCHED_IDLE`` once in it,
    where nice 19 any thread may take. Elsewhere (not lowered, no such thread) it starts here."""
    if _saved_switch_s is None:
        thread.start()
    else:
        _on_spawner(thread.start)


def out_of_turn() -> None:
    """The calling thread is ending: its id may be another thread's next."""
    _in_turn.discard(threading.get_native_id())


def lower_self() -> None:
    """``preexec_fn`` for the doctor's helpers: idle CPU and I/O, whatever its spawner's."""
    _lower_thread(0)


def sampler_nice() -> None:
    """``preexec_fn`` for py-spy: nice 19 and idle I/O, but never ``SCHED_IDLE``.

    A ``SCHED_IDLE`` sampler runs only when a core is idle, so on a busy host it would read
    the patient's stack mostly while the patient waits: samples biased toward waiting, and
    stack-sampled shares invented rather than measured. Nice 19 still yields to the patient
    but is scheduled in turn, so its samples stay spread over time.
    """
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE_IDLE)
    set_ioprio(0, IOPRIO_CLASS_IDLE)


def restore_normal() -> None:
    """``preexec_fn`` for what must run at normal priority (gdb): SCHED_OTHER, nice 0, default I/O.

    Needs CAP_SYS_NICE once lowered; without it the child keeps what it inherited, which is why
    gdb is spawned from :func:`popen_normal`'s normal-priority thread.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    set_ioprio(0, IOPRIO_CLASS_NONE)


def set_ioprio(tid: int, io_class: int, level: int = 0) -> bool:
    """``ioprio_set`` for one thread (0: the caller); False where the OS has none or refuses."""
    nums = _SYS_IOPRIO.get(platform.machine())
    if _libc is None or nums is None or platform.system() != "Linux":
        return False
    value = (io_class << _IOPRIO_CLASS_SHIFT) | (level if io_class != IOPRIO_CLASS_NONE else 0)
    return int(_libc.syscall(nums[0], _IOPRIO_WHO_PROCESS, tid, value)) == 0


def get_ioprio_class(tid: int = 0) -> int | None:
    nums = _SYS_IOPRIO.get(platform.machine())
    if _libc is None or nums is None:
        return None
    value = int(_libc.syscall(nums[1], _IOPRIO_WHO_PROCESS, tid))
    return None if value < 0 else value >> _IOPRIO_CLASS_SHIFT


def thread_priority(pid: int, tid: int) -> tuple[str, int]:
    """(policy name, nice) of one thread, from ``/proc/<pid>/task/<tid>/stat`` (tests check these)."""
    with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8", errors="replace") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): nice is field 19, policy field 41
    return _POLICIES.get(int(fields[38]), fields[38]), int(fields[16])


def name_thread(name: str) -> None:
    """Give the calling thread a kernel name (``/proc/self/task/*/comm``), so its CPU can be told apart."""
    if _libc is not None:
        with contextlib.suppress(Exception):
            _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


# -- the whole doctor ----------------------------------------------------------------
def lower_doctor() -> dict[str, str]:
    """Lower every thread of this process but :func:`popen_normal`'s; what it got, for meta.json.

    Call it after spawning the training (``run``) and before starting samplers; threads
    started later inherit it. Never call it in the training process itself (the Python API).

    It also lengthens this interpreter's GIL switch interval to :data:`IDLE_SWITCH_S`: an idle
    thread of ours is preempted by the patient while it holds the GIL, and another of ours that
    waits for it would wake every 5 ms (CPython's default) to ask for it again, each wake taking
    a core from the training for nothing (measured: ~40 wakes a second of the host sampler on a
    saturated host). A thread that blocks or sleeps still hands the GIL over at once.
    """
    done = {_spawner.native_id} if _spawner is not None else set()
    got: list[tuple[str, str]] = []
    for _ in range(5):  # a thread that one not yet lowered starts meanwhile inherits its priority: list again
        try:
            tids = {int(t) for t in os.listdir("/proc/self/task")} - done
        except OSError:
            tids = {0} - done
        if not tids:
            break
        # the calling thread last: once idle on a saturated host it waits seconds for each next
        # step, and the threads not yet lowered would run at their old priority all that while
        for tid in sorted(tids, key=lambda t: (t == threading.get_native_id(), t)):
            if tid in _in_turn:  # the host sampler: nice 19, said on its own (in_turn)
                _turn_thread(tid)
                continue
            lowered = _lower_thread(tid)
            if lowered[0] != "unchanged" or tid == 0 or os.path.exists(f"/proc/self/task/{tid}"):
                got.append(lowered)  # (a thread that ended meanwhile was not left unlowered)
        done |= tids
    global _saved_switch_s
    if _saved_switch_s is None:
        _saved_switch_s = sys.getswitchinterval()
        sys.setswitchinterval(max(_saved_switch_s, IDLE_SWITCH_S))
    order = ["SCHED_IDLE", f"nice {NICE_IDLE}", "unchanged"]
    cpu = max((c for c, _ in got), key=order.index, default="unchanged")  # the least lowered thread
    io = "idle" if got and all(i == "idle" for _, i in got) else "unchanged"
    return {"cpu": cpu, "io": io}


def restore_doctor() -> bool:
    """Best effort: every thread back to SCHED_OTHER, nice 0, default I/O (needs CAP_SYS_NICE).

    For a process that runs on after being a doctor (``run`` called in-process, ``try``'s trials,
    attach's detach and report). True when the calling thread is back at normal priority.
    """
    global _saved_switch_s
    if _saved_switch_s is not None:
        sys.setswitchinterval(_saved_switch_s)
        _saved_switch_s = None
    for tid in _tids():
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        set_ioprio(tid, IOPRIO_CLASS_NONE)
    try:
        return os.sched_getscheduler(0) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, 0) == 0
    except OSError:
        return False


def nice_doctor(nice: int) -> dict[str, str]:
    """Every thread of this process but :func:`popen_normal`'s at ``nice`` (attach, before its hooks)."""
    keep = {_spawner.native_id} if _spawner is not None else set()
    ok = True
    for tid in _tids():
        if tid not in keep:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except (OSError, AttributeError):
                ok = False
    return {"cpu": f"nice {nice}" if ok else "unchanged", "io": "unchanged"}


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


class _Spawner(threading.Thread):
    """A thread left at normal priority whose only work is starting gdb (a fork and an exec) and
    the threads that keep their turn (:func:`start_in_turn`)."""

    def __init__(self) -> None:
        super().__init__(name="gpudoctor-spawn", daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self.ready = threading.Event()

    def run(self) -> None:
        name_thread("gd-spawn")
        self.ready.set()
        while True:
            fn, fut = self.jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed back to the caller
                fut.set_exception(exc)


def start_normal_spawner() -> None:
    """Start :func:`popen_normal`'s thread; call it before :func:`lower_doctor`."""
    global _spawner
    if _spawner is None:
        _spawner = _Spawner()
        _spawner.start()
        _spawner.ready.wait(5)


def popen_normal(argv: list[str], then: Callable[[], None] | None = None,
                 **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` from a normal-priority thread, with :func:`restore_normal` in the child
    (then ``then``, e.g. a lower nice value that any process may take)."""
    def preexec() -> None:
        restore_normal()
        if then is not None:
            then()

    def spawn() -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, preexec_fn=preexec, **kwargs)

    return _on_spawner(spawn)


def _on_spawner(fn: Callable[[], T]) -> T:
    """``fn()`` on the normal-priority spawner thread, waited for; here where there is none or this is it."""
    spawner = _spawner
    if spawner is None or threading.current_thread() is spawner:
        return fn()
    fut: Future[T] = Future()
    spawner.jobs.put((fn, fut))
    return fut.result()
