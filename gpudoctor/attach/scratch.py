"""The attach doctor's own folders outside the run folder: its locks and per-session scratch.

Why not fixed names in /tmp: anyone can create ``/tmp/gpudoctor-attach-<pid>.lock``
first and so refuse root's attach, or plant a link where a doctor will write. So
everything lives in one folder only the doctor's user can write (``/run/gpudoctor``
for root, ``$XDG_RUNTIME_DIR/gpudoctor``, else ``<tmp>/gpudoctor-<uid>``), refused
in one line when it exists but is someone else's or writable by others.

Each doctor keeps py-spy's output and gdb's command files in ``session-<pid>-<start>/``
there. A doctor killed with SIGKILL cannot remove it, nor its lock: the next attach
does, once the process that made them (pid *and* start time, so a reused pid does
not count) is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import tempfile
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError

_SESSION = "session-"
_LOCK_SUFFIX = ".lock"
_session: Path | None = None


def state_dir() -> Path:
    """The doctor user's private folder for locks and scratch, created 0700 when missing."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if uid == 0 and os.path.isdir("/run") and os.access("/run", os.W_OK):
        base = Path("/run/gpudoctor")
    elif runtime and os.path.isabs(runtime) and _owned_dir(runtime, uid):
        base = Path(runtime) / "gpudoctor"
    else:
        base = Path(tempfile.gettempdir()) / f"gpudoctor-{uid}"
    try:
        return safefs.private_dir(base, "the attach state folder")
    except UserError as exc:
        raise UserError(f"{exc} (gpudoctor attach keeps its locks there; remove it, or set XDG_RUNTIME_DIR "
                        "to a private folder of yours)", exc.exit_code) from None


def _owned_dir(path: str, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == uid and os.path.isdir(path) and not os.path.islink(path)


def process_token(pid: int) -> str | None:
    """``<pid>-<start time in clock ticks>``: names one process, never a later one with the same pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return f"{pid}-{fields[19]}"  # field 22 of the line: starttime


def token_alive(token: str) -> bool:
    """Is the process named by ``token`` (from :func:`process_token`) still running?"""
    pid = token.split("-", 1)[0]
    return pid.isdigit() and process_token(int(pid)) == token


def session_dir() -> Path:
    """This doctor process's scratch folder (0700, inside :func:`state_dir`), made once."""
    global _session
    token = process_token(os.getpid())
    if _session is None or _session.name != f"{_SESSION}{token}" or not _session.is_dir():
        folder = state_dir() / f"{_SESSION}{token}"
        _session = safefs.private_dir(folder, "the attach scratch folder")
    return _session


def end_session() -> None:
    """Remove this doctor's scratch folder (its py-spy output, gdb commands)."""
    global _session
    if _session is not None:
        shutil.rmtree(_session, ignore_errors=True)
        _session = None


def remove_stale() -> list[Path]:
    """Remove the sessions and locks of doctors that are gone (killed with SIGKILL); returns them."""
    removed = []
    folder = state_dir()
    for entry in folder.iterdir():
        name = entry.name
        if name.startswith(_SESSION):
            if not token_alive(name[len(_SESSION):]) and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        elif name.endswith(_LOCK_SUFFIX):
            holder = lock_holder(entry)
            if holder is None or not token_alive(holder):
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                removed.append(entry)
    return removed


def lock_holder(path: Path) -> str | None:
    """The process token written in a lock file, or None when unreadable."""
    try:
        text = safefs.read_bytes(path, limit=64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text or None


# -- children that die with the doctor -------------------------------------------------------
_PR_SET_PDEATHSIG = 1
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)  # loaded before any fork
except OSError:  # pragma: no cover - not Linux/glibc
    _libc = None


def die_with_parent(parent: int) -> None:
    """``preexec_fn``: the child gets SIGKILL when the doctor's thread that started it ends.

    A doctor killed with SIGKILL cannot stop its py-spy windows itself; py-spy's
    non-blocking mode never stops the patient, so killing it is harmless.
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the doctor died before the prctl: nothing would kill us later
        os._exit(1)
