"""One doctor per patient: ``/tmp/gpudoctor-attach-<pid>.lock``.

Two doctors would inject two sets of hooks (the second install is refused in
the patient anyway) and fight over detaching. The lock is created with
``O_EXCL`` and holds the doctor's pid; a lock whose doctor is gone (killed with
SIGKILL) is stale and taken over.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

from gpudoctor.errors import UserError


def lock_path(pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"gpudoctor-attach-{pid}.lock"


class AttachLock:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.path = lock_path(pid)
        self._held = False

    def acquire(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if (holder is not None and pid_alive(holder)) or (holder is None and self._fresh()):
                    raise UserError(
                        f"another gpudoctor (pid {holder}) is already attached to pid {self.pid}; "
                        f"wait for it to finish or stop it (if it is gone, remove {self.path})", 3
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # stale: its doctor exited without cleaning up
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            self._held = True
            return
        raise UserError(f"could not take the attach lock {self.path}; remove it if no gpudoctor is running", 3)

    def release(self) -> None:
        if self._held and self._holder() == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._held = False

    def _fresh(self) -> bool:
        """Created a moment ago: its doctor may not have written its pid yet."""
        try:
            return time.time() - self.path.stat().st_mtime < 5.0
        except FileNotFoundError:
            return False

    def _holder(self) -> int | None:
        try:
            return int(self.path.read_text().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def __enter__(self) -> AttachLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
