"""May the doctor write into this tracker folder? Only into its own user's, which nobody else can write.

The doctor may be root, and a tracker folder (``mlruns/``, a TensorBoard log dir, ``wandb/``) is
named by the training process. The trackers' own libraries write there with plain ``open`` and
``mkdir``, which follow links; so instead of wrapping each of their writes, the doctor writes only
where no other user can plant a link: the folder and every existing folder below it that the
tracker writes into must be real folders (not links) of the doctor's user, writable by nobody else,
and every folder above it owned by root or that user and not writable by others (unless sticky,
like ``/tmp``). The path is walked folder by folder with ``O_NOFOLLOW`` and each is checked on its
descriptor: never resolved first, since a link the patient swapped in for its log dir resolves to
a folder (``/etc/cron.d``) that passes every check. Root beside another user's training therefore adds nothing to that user's runs
and says so; that user's own doctor, or the in-process API, can.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # as the kernel's own path walk


def open_checked(root: str | os.PathLike[str], below: tuple[str, ...] = ()) -> tuple[int, str] | str:
    """``root`` opened for writing into, or why the doctor must not (a string).

    Walked from ``/`` one folder at a time, each opened ``O_NOFOLLOW | O_DIRECTORY`` and checked on
    its descriptor, never resolved first: a link is followed only when the doctor's user or root
    made it, in a folder nobody else can write (a link the patient planted, even one pointing at a
    root-owned folder like ``/etc/cron.d``, is refused). Every folder on the way must be root's or
    the doctor's user's and not writable by others unless sticky; ``root`` itself and each existing
    ``root/below[0]/below[1]...`` must be the doctor's user's, writable by nobody else. Returns the
    descriptor of ``root`` (the caller closes it; write through :func:`gpudoctor.common.safefs.fd_path`)
    and the path walked.
    """
    me = os.geteuid()
    path = os.fspath(root)
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    parts = [p for p in path.split("/") if p and p != "."]
    fd = os.open("/", _FOLDER)
    walked: list[str] = []
    links = 0
    try:
        why = _above(Path("/"), os.fstat(fd), me)
        while why is None and parts:
            name = parts.pop(0)
            here = Path("/", *walked)
            try:
                nfd = os.open(name, _FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    return f"{here / name} cannot be read ({exc.strerror or exc})"
                st = os.lstat(name, dir_fd=fd)
                if not stat.S_ISLNK(st.st_mode):
                    return f"{here / name} is not a folder (a link or a file)"
                if st.st_uid not in (0, me):
                    return (f"{here / name} is a link made by uid {st.st_uid}, not by root or the doctor's user "
                            f"(uid {me}); the doctor never writes through it")
                links += 1
                if links > MAX_LINKS:
                    return f"{path}: too many links"
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd, walked = os.open("/", _FOLDER), []
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            os.close(fd)
            fd = nfd
            if name == "..":
                walked = walked[:-1]
            else:
                walked.append(name)
            st = os.fstat(fd)
            where = Path("/", *walked)
            why = _own(where, st, me) if not parts else _above(where, st, me, above=path)
        if why is None:
            why = _below(fd, Path("/", *walked), below, me)
        if why is not None:
            return why
        fd, ok = -1, (fd, str(Path("/", *walked)))
        return ok
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    finally:
        if fd >= 0:
            os.close(fd)


def _above(where: Path, st: os.stat_result, me: int, above: str | None = None) -> str | None:
    tail = f" (above {above})" if above else ""
    if st.st_uid not in (0, me):
        return f"{where}{tail} belongs to uid {st.st_uid}, not to root or the doctor's user"
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        return f"{where}{tail} is writable by other users"
    return None


def _below(fd: int, where: Path, below: tuple[str, ...], me: int) -> str | None:
    """Each existing folder below, opened through the last one: real, the doctor's user's, private."""
    opened: list[int] = []
    try:
        cur = fd
        for name in below:
            where = where / name
            try:
                cur = os.open(name, _FOLDER, dir_fd=cur)
            except FileNotFoundError:
                return None  # the tracker creates it, as the doctor's user, in a folder only that user writes
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    return f"{where} is not a folder (a link or a file)"
                return f"{where} cannot be read ({exc.strerror or exc})"
            opened.append(cur)
            why = _own(where, os.fstat(cur), me)
            if why:
                return why
        return None
    finally:
        for one in opened:
            os.close(one)


def problem(root: str | os.PathLike[str], below: tuple[str, ...] = ()) -> str | None:
    """Why the doctor must not write under ``root`` (and ``root/below[0]/below[1]...``), or None."""
    checked = open_checked(root, below)
    if isinstance(checked, str):
        return checked
    os.close(checked[0])
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
    """A file the tracker rewrites in place (MLflow's sqlite database): ours, real, not a link, in a
    folder that passes :func:`open_checked` (checked on descriptors, not on a resolved path)."""
    checked = open_checked(os.path.dirname(os.fspath(path)))
    if isinstance(checked, str):
        return checked
    fd, _ = checked
    try:
        st = os.lstat(os.path.basename(os.fspath(path)), dir_fd=fd)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file (a link, FIFO or folder)"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to the doctor's user (uid {os.geteuid()})"
    return None
