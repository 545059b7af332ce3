"""Claiming a run folder: new and unique by default, one doctor at a time, never mixed.

Why: a default ``reports/run-<second>`` is shared by two runs started in the same second,
and a reused ``--out`` mixed the earlier run's events into the new report and kept its
stale report files (issue 12, #7). So a default folder is made with ``mkdir`` (the claim;
a taken name gets ``-2``, ``-3``...), a folder is locked (``flock``) while a doctor records
into it, and an earlier recording found in it is moved aside, whole, into
``previous-<time>/`` with one line saying where. Only the names the doctor writes are
moved: an ``--out`` that also holds the user's own files keeps them in place.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import os
from pathlib import Path

from gpudoctor.common.errors import UserError

RECORDING_NAMES = ("meta.json", "samples", "events", "attach", "report.json", "report.html", "report.md",
                   "replay_measure.json", "trial", "apply.json")
_held: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> descriptor holding the lock, per process


def unique_folder(parent: Path, stem: str, what: str = "--out") -> Path:
    """Create ``parent/stem`` 0700, or ``stem-2``, ``stem-3``... when taken; the mkdir is the claim."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            path = parent / (stem if n == 1 else f"{stem}-{n}")
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o700)
                return path
    except OSError as exc:
        raise UserError(f"cannot create a folder in {parent}: {exc.strerror or exc}; "
                        f"choose a writable folder with {what}") from None
    raise AssertionError("itertools.count() ended")


def lock(folder: Path) -> None:
    """Hold an exclusive lock on ``folder`` until this process exits; refuse a folder another
    doctor is recording into. Re-claiming a folder this process already holds is allowed
    (``gpudoctor.profile(out=...)`` twice in one script)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _held:
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"--out {folder} is being recorded into by another gpudoctor right now; "
                        "choose another --out (or leave it out for a new folder)") from None
    _held[(st.st_dev, st.st_ino)] = fd


def set_aside(folder: Path) -> Path | None:
    """Move an earlier recording in ``folder`` into ``folder/previous-<its time>/``; None if none."""
    found = [name for name in RECORDING_NAMES if os.path.lexists(folder / name)]
    if not found:
        return None
    meta = folder / "meta.json"
    when = os.lstat(meta).st_mtime if os.path.lexists(meta) else os.lstat(folder / found[0]).st_mtime
    keep = unique_folder(folder, "previous-" + dt.datetime.fromtimestamp(when).strftime("%Y%m%d-%H%M%S"))
    for name in found:
        os.rename(folder / name, keep / name)  # a link moves as a link: nothing is followed
    return keep
