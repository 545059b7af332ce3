"""May the doctor write into this tracker folder? Only into its own user's, which nobody else can write.

The doctor may be root, and a tracker folder (``mlruns/``, a TensorBoard log dir, ``wandb/``) is
named by the training process. The trackers' own libraries write there with plain ``open`` and
``mkdir``, which follow links; so instead of wrapping each of their writes, the doctor writes only
where no other user can plant a link: the folder and every existing folder below it that the
tracker writes into must be real folders (not links) of the doctor's user, writable by nobody else,
and every folder above it owned by root or that user and not writable by others (unless sticky,
like ``/tmp``). Root beside another user's training therefore adds nothing to that user's runs
and says so; that user's own doctor, or the in-process API, can.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def problem(root: str | os.PathLike[str], below: tuple[str, ...] = ()) -> str | None:
    """Why the doctor must not write under ``root`` (and ``root/below[0]/below[1]...``), or None."""
    me = os.geteuid()
    real = Path(os.path.realpath(root))
    try:
        st = os.lstat(real)
    except OSError as exc:
        return f"{root} cannot be read ({exc.strerror or exc})"
    why = _own(real, st, me)
    if why:
        return why
    for parent in real.parents:
        try:
            pst = os.stat(parent)
        except OSError as exc:
            return f"{parent} cannot be read ({exc.strerror or exc})"
        if pst.st_uid not in (0, me):
            return f"{parent} (above {root}) belongs to uid {pst.st_uid}, not to root or the doctor's user"
        if pst.st_mode & _OTHERS_WRITE and not pst.st_mode & stat.S_ISVTX:
            return f"{parent} (above {root}) is writable by other users"
    path = real
    for name in below:
        path = path / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None  # the tracker creates it, as the doctor's user, in a folder only that user writes
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror or exc})"
        why = _own(path, st, me)
        if why:
            return why
    return None


def _own(path: Path, st: os.stat_result, me: int) -> str | None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (a link or a file)"
    if st.st_uid != me:
        return (f"{path} belongs to uid {st.st_uid}, not to the doctor's user (uid {me}); run the doctor as "
                "that user, or add the figures from inside the training (gpudoctor.profile / the callback)")
    if st.st_mode & _OTHERS_WRITE:
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """A file the tracker rewrites in place (MLflow's sqlite database): ours, real, not a link."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file (a link, FIFO or folder)"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to the doctor's user (uid {os.geteuid()})"
    return None
