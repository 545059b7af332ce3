"""A small process at normal priority that puts an idle doctor back at normal priority when it must act.

Why: once lowered (:func:`gpudoctor.processes.priority.lower_doctor`) the doctor's threads run
``SCHED_IDLE``. On a host whose cores the patient and other programs keep busy they get almost no
CPU, and one of them preempted while it holds the GIL stalls every other, a thread put back at
normal priority included: a 30 s ``attach --duration`` beside three busy programs on two cores ran
622 s, until the patient itself exited, and Ctrl-C waited the same way. Nothing inside the
interpreter can be on time then, so the clock is kept outside it. The waker sleeps in the kernel
(``poll``) and, when the deadline passes, the watched process exits (its pidfd) or the doctor gets
SIGINT, SIGTERM or SIGHUP (CPython's C-level handler writes the signal number to the wakeup fd
without the GIL), sets every thread of the doctor back to ``SCHED_OTHER``, nice 0 (where allowed:
root, or CAP_SYS_NICE), then exits. The doctor's own :func:`restore_doctor` follows as before.

The waker dies with the doctor (``PR_SET_PDEATHSIG``) and acts only on its own parent, read with
``getppid``: never a pid it was told.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from gpudoctor.processes import priority
from gpudoctor.processes.pids import DIES_WITH_PARENT

ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# argv: deadline (epoch s, 0: none), the wakeup fd (-1: none), pidfds to watch. Ctrl-C in the terminal
# reaches the waker too: it ignores SIGINT itself and learns of it through the doctor's wakeup fd.
_CODE = DIES_WITH_PARENT + """\
import os, select, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
doctor = os.getppid()
if doctor == 1:
    sys.exit(0)
deadline, wake, pidfds = float(sys.argv[1]), int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
ending = {@ENDING@}
poll = select.poll()
for fd in ([wake] if wake >= 0 else []) + pidfds:
    poll.register(fd, select.POLLIN)
while True:
    left = None if deadline <= 0 else max(0.0, deadline - time.time())
    if left == 0.0:
        break
    ready = poll.poll(None if left is None else left * 1000)
    if any(fd != wake for fd, _ in ready):
        break
    if ready:
        got = os.read(wake, 64)
        if not got or ending.intersection(got):
            break
for tid in os.listdir(f"/proc/{doctor}/task"):
    try:
        os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, int(tid), 0)
    except OSError:
        pass
""".replace("@ENDING@", ", ".join(str(int(s)) for s in ENDING_SIGNALS))


class Waker:
    """The running waker; :meth:`stop` ends it and gives the doctor's wakeup fd back."""

    def __init__(self, deadline: float | None, watch_pids: tuple[int, ...] = ()) -> None:
        self._fds: list[int] = []
        self._wake_w: int | None = None
        self._old_wakeup: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        wake_r = -1
        if threading.current_thread() is threading.main_thread():  # set_wakeup_fd works from the main thread only
            wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_w, False)
            self._fds.append(wake_r)
            self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for pid in watch_pids:
            with contextlib.suppress(AttributeError, OSError):  # no pidfd here (Linux < 5.3): the deadline only
                self._fds.append(os.pidfd_open(pid))
        pidfds = self._fds[1:] if wake_r >= 0 else self._fds
        argv = [sys.executable, "-I", "-S", "-c", _CODE, repr(deadline or 0.0), str(wake_r), *map(str, pidfds)]
        try:
            self.proc = priority.popen_normal(argv, pass_fds=tuple(self._fds), stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            self.stop()  # no waker: the doctor is as it was before there was one

    def stop(self) -> None:
        if self._old_wakeup is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._old_wakeup)
            self._old_wakeup = None
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.proc = None
        for fd in self._fds + ([self._wake_w] if self._wake_w is not None else []):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds, self._wake_w = [], None


def start(deadline: float | None, watch_pids: tuple[int, ...] = ()) -> Waker | None:
    """A waker for this lowered doctor (Linux only; None elsewhere): by ``deadline`` (epoch seconds),
    when any of ``watch_pids`` exits, or on an ending signal, the doctor is back at normal priority."""
    if sys.platform != "linux":
        return None
    return Waker(deadline if deadline is None else max(deadline, time.time()), watch_pids)

