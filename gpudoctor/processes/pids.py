"""Is a process alive, and waiting for a child to end: one answer for every caller.

``pid_alive``: attach's locks and sessions and replay's scratch folders. ``ExitWaiter``:
``run`` and the sweep waiting for the training they measure. ``DIES_WITH_PARENT``: the first
lines of every ``python -c`` helper the doctor starts. Stdlib only: the attach payload imports
this module inside the patient.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess

# The first lines of a ``python -c`` helper: the kernel kills it when the process that started it dies,
# stopped or not (PR_SET_PDEATHSIG), so no helper outlives the doctor.
DIES_WITH_PARENT = "import ctypes, signal\nctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"


def pid_alive(pid: int) -> bool:
    """Running (a zombie is not); a process of another user counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class ExitWaiter:
    """Waits for a child's exit on its pidfd (Linux 5.3+), else through ``Popen.wait``'s polling.

    Why not ``proc.wait(timeout)``: with a timeout CPython polls ``waitpid`` every 50 ms or less,
    ~20 wakes a second of the doctor beside a training that may keep every core busy (and
    that a sweep is timing). A pidfd sleeps in the kernel until the child exits.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here: Popen.wait's polling
            self.fd = os.pidfd_open(proc.pid)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if the child still runs after ``timeout`` seconds."""
        if self.fd is None:
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        ready, _, _ = select.select([self.fd], [], [], timeout)  # a signal's handler runs, then this resumes
        return self.proc.wait() if ready else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
