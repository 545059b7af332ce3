"""One doctor per patient: ``attach-<pid>.lock`` in the doctor's private state folder.

Two doctors would inject two sets of hooks (the second install is refused in
the patient anyway) and fight over detaching. The lock lives in
:func:`gpudoctor.attach.scratch.state_dir` (0700, the doctor's user's alone), so
no other user can plant it to refuse an attach, or a link to make the doctor
write elsewhere. It names its doctor by pid and start time and appears whole
(written aside, then hard-linked into place): a lock whose doctor is gone (killed
with SIGKILL) is stale and taken over, as is a dead doctor's scratch folder.

Imported inside the patient too (:func:`pid_alive`, by the payload); what it
imports is the standard library and two small modules of ours.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpudoctor.attach import scratch
from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.processes.pids import pid_alive as pid_alive  # its users import it from here too


def lock_path(pid: int) -> Path:
    return scratch.state_dir() / f"attach-{pid}.lock"


class AttachLock:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.path = lock_path(pid)
        self._held = False

    def acquire(self) -> None:
        scratch.remove_stale()
        me = scratch.process_token(os.getpid()) or str(os.getpid())
        tmp = scratch.session_dir() / self.path.name  # a dead doctor's is removed with its folder
        tmp.unlink(missing_ok=True)
        with os.fdopen(safefs.create_new(tmp, 0o600), "w") as fh:
            fh.write(me)
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)  # appears with its content, or not at all
                except FileExistsError:
                    holder = scratch.lock_holder(self.path)
                    if holder is not None and scratch.token_alive(holder):
                        raise UserError(
                            f"another gpudoctor (pid {holder.split('-')[0]}) is already attached to pid {self.pid}; "
                            "wait for it to finish or stop it", 3) from None
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()  # stale: its doctor exited without cleaning up
                    continue
                self._held = True
                return
        finally:
            tmp.unlink(missing_ok=True)
        raise UserError(f"could not take the attach lock {self.path}; remove it if no gpudoctor is running", 3)

    def release(self) -> None:
        if self._held and scratch.lock_holder(self.path) == scratch.process_token(os.getpid()):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._held = False

    def __enter__(self) -> AttachLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
