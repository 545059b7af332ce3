"""Claiming a run folder: new and unique by default, one doctor at a time, never mixed.

Why: a default ``reports/run-<second>`` is shared by two runs started in the same second,
and a reused ``--out`` mixed the earlier run's events into the new report and kept its
stale report files (issue 12, #7). So a default folder is made with ``mkdir`` (the claim;
a taken name gets ``-2``, ``-3``...), a folder is locked (``flock``) while a doctor records
into it, and an earlier recording found in it is moved aside, whole, into
``previous-<time>/`` with one line saying where. Only the names the doctor writes are
moved: an ``--out`` that also holds the user's own files keeps them in place.

All of it goes through descriptors (issue 34): the parent is walked and checked by
:func:`safefs.open_parent` (no other user can rename the folder and put a link in its place),
names are made with ``mkdirat`` and moved with ``renameat`` relative to the folder's descriptor,
and the locked descriptor is the one every later write goes through.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import os
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError

RECORDING_NAMES = ("meta.json", "samples", "events", "attach", "report.json", "report.html", "report.md",
                   "replay_measure.json", "trial", "apply.json", "length_cost.json",
                   "warm_compute.json")
_held: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> descriptor holding the lock, per process


def unique_folder(parent: Path, stem: str, what: str = "--out") -> Path:
    """Create ``parent/stem`` 0700, or ``stem-2``, ``stem-3``... when taken; the mkdir is the claim.

    ``parent`` is walked and checked first (:func:`safefs.open_parent`): one another user can
    write is refused in one line, before anything is made in it.
    """
    fd = safefs.open_parent(parent, "to make the run folder in")
    try:
        return parent / unique_name(fd, stem, parent, what)
    finally:
        os.close(fd)


def unique_name(parent_fd: int, stem: str, shown: Path, what: str = "--out") -> str:
    """``stem``, ``stem-2``, ... whichever ``mkdir`` (0700) first creates below ``parent_fd``."""
    try:
        for n in itertools.count(1):
            name = stem if n == 1 else f"{stem}-{n}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent_fd)
                return name
    except OSError as exc:
        raise UserError(f"cannot create a folder in {shown}: {exc.strerror or exc}; "
                        f"choose a writable folder with {what}") from None
    raise AssertionError("itertools.count() ended")


def lock(fd: int, shown: Path) -> int:
    """Hold an exclusive lock on folder ``fd`` until this process exits; refuse a folder another
    doctor is recording into. Re-claiming a folder this process already holds is allowed
    (``gpudoctor.profile(out=...)`` twice in one script). Returns the descriptor kept open for
    the process's life (``fd``, or the one already held, ``fd`` then closed)."""
    st = os.fstat(fd)
    held = _held.get((st.st_dev, st.st_ino))
    if held is not None:
        os.close(fd)
        return held
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"--out {shown} is being recorded into by another gpudoctor right now; "
                        "choose another --out (or leave it out for a new folder)") from None
    _held[(st.st_dev, st.st_ino)] = fd
    return fd


def set_aside(fd: int, shown: Path) -> Path | None:
    """Move an earlier recording in folder ``fd`` into its ``previous-<its time>/``; None if none."""
    found = [name for name in RECORDING_NAMES if _lexists(name, fd)]
    if not found:
        return None
    first = "meta.json" if "meta.json" in found else found[0]
    when = os.lstat(first, dir_fd=fd).st_mtime
    keep = unique_name(fd, "previous-" + dt.datetime.fromtimestamp(when).strftime("%Y%m%d-%H%M%S"), shown)
    for name in found:  # a link moves as a link: nothing is followed
        os.rename(name, f"{keep}/{name}", src_dir_fd=fd, dst_dir_fd=fd)
    return shown / keep


def _lexists(name: str, fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return False
    return True
