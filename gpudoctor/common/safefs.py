"""Files in folders someone else may write: never through a link, never a FIFO, never a stranger's file.

The doctor may run as root beside another user's training. Every folder that user
can write (``attach/``, ``events/`` of an attach, a pre-made ``--out``, a folder
handed to ``gpudoctor report``) may hold a symlink to ``/etc/shadow``, a FIFO that
blocks a reader forever, or a file the doctor did not write. These helpers are the
only way the doctor opens such paths:

* reads are ``O_NOFOLLOW | O_NONBLOCK`` and must land on a regular file, owned by
  the expected user when one is given;
* new files are ``O_CREAT | O_EXCL | O_NOFOLLOW`` (nothing planted is ever reused);
* replacements go through a fresh temporary file in the same folder and
  ``rename``, which replaces a planted link instead of following it.

Only the last path component is protected: callers keep the folders above it
owned by the doctor's user (see :func:`private_dir`), or hold the folder itself
open: :func:`pinned_folder` opens a folder once (``O_NOFOLLOW | O_DIRECTORY``) and
gives ``/proc/self/fd/N``, through which every later read and write resolves, so a
folder renamed and replaced by a link meanwhile redirects nothing.

A run folder does both (:func:`open_private_folder`, issue 34): every folder above it is walked
from ``/`` on descriptors and must be one no other user can write (else she could rename the run
folder and put a link in its place, for the doctor and for the training's own hooks, which reach
it by path), and the folder is then held open for every write of the doctor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpudoctor.common.errors import UserError

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FD_FOLDER = Path("/proc/self/fd")
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_MAX_LINKS = 40  # as the kernel's own path walk


class UnsafeFile(OSError):
    """A path that is a link, not a regular file, or owned by an unexpected user."""


def _check_regular(fd: int, path: os.PathLike[str] | str, owners: tuple[int, ...] | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path} is not a regular file")
    if owners is not None and st.st_uid not in owners:
        os.close(fd)
        raise UnsafeFile(f"{path} is owned by uid {st.st_uid}, not by {' or '.join(map(str, owners))}")
    return st


def _owners(owner: int | None) -> tuple[int, ...] | None:
    return None if owner is None else tuple(sorted({owner, os.geteuid()}))


def _open_fd(path: os.PathLike[str] | str, flags: int, mode: int = 0o600) -> int:
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symlink
            raise UnsafeFile(f"{path} is a symbolic link") from None
        raise


def open_read(path: os.PathLike[str] | str, owner: int | None = None) -> IO[bytes]:
    """Open a regular file for reading without following a link or blocking on a FIFO.

    ``owner``: the file must belong to this uid (or to the doctor's own user).
    Raises :class:`UnsafeFile` (an ``OSError``) otherwise, ``FileNotFoundError`` as usual.
    """
    fd = _open_fd(path, _READ_FLAGS)
    _check_regular(fd, path, _owners(owner))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: os.PathLike[str] | str, owner: int | None = None, limit: int | None = None) -> bytes:
    """The whole file (at most ``limit`` bytes; more raises :class:`UnsafeFile`), read safely."""
    with open_read(path, owner) as fh:
        if limit is None:
            return fh.read()
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path} is larger than {limit} bytes")
    return data


def create_new(path: os.PathLike[str] | str, mode: int = 0o600) -> int:
    """A new file, refused if anything (a link included) already has that name; returns the fd."""
    fd = _open_fd(path, _NEW_FLAGS, mode)
    with contextlib.suppress(OSError):
        os.fchmod(fd, mode)  # the umask may have narrowed it; never widen beyond ``mode``
    return fd


def open_append(path: os.PathLike[str] | str, mode: int = 0o600, owner: int | None = None) -> IO[str]:
    """Append to a regular file of ours (created ``mode`` when new), never through a link."""
    fd = _open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    _check_regular(fd, path, _owners(owner) if owner is not None else (os.geteuid(),))
    return os.fdopen(fd, "a", encoding="utf-8")


def replace_file(path: os.PathLike[str] | str, data: bytes | str, mode: int = 0o600, *,
                 dir_fd: int | None = None) -> None:
    """Write ``path`` atomically: a fresh temp file beside it (O_EXCL), then ``rename`` over it.

    ``rename`` replaces a planted symlink or file with ours instead of writing through it.
    The folder is opened once and both steps go through that descriptor (``dir_fd``, when
    given, is that folder and ``path`` a bare name), so a folder swapped for a link between
    them cannot redirect the rename. A failure leaves no half-written ``path`` and no temp
    file behind (a full disk leaves the old file, or none, never an empty one).
    """
    name = os.fspath(path) if dir_fd is not None else Path(path).name
    folder = dir_fd if dir_fd is not None else open_dir(Path(path).parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, _NEW_FLAGS, mode, dir_fd=folder)
        try:
            os.fchmod(fd, mode)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    finally:
        if dir_fd is None:
            os.close(folder)


def open_dir(path: os.PathLike[str] | str) -> int:
    """A descriptor of folder ``path``, to create files in it by name (``dir_fd``); caller closes it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_folder(path: os.PathLike[str] | str, *, dir_fd: int | None = None) -> int:
    """Folder ``path`` opened once, never through a link in its last component; caller closes it.

    Raises :class:`UnsafeFile` for a link or a non-folder, ``FileNotFoundError`` as usual. Check
    its owner on the descriptor (``os.fstat``), never on the path, which can change after.
    """
    try:
        return os.open(path, _FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symbolic link") from None
        if exc.errno == errno.ENOTDIR:
            try:
                link = stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
            except OSError:
                link = False
            raise UnsafeFile(f"{path} is {'a symbolic link' if link else 'not a folder'}") from None
        raise


def fd_path(fd: int) -> Path:
    """A path that reaches exactly the folder ``fd`` holds, whatever is renamed or linked after.

    ``/proc/self/fd/N``: every path below it resolves from that descriptor, so a folder swapped
    for a link while the doctor reads or writes it cannot redirect one file.
    """
    return _FD_FOLDER / str(fd)


def is_pinned(path: os.PathLike[str] | str) -> bool:
    """Whether ``path`` is already a descriptor's folder (:func:`fd_path`)."""
    return Path(path).parent == _FD_FOLDER


@contextlib.contextmanager
def pinned_folder(path: os.PathLike[str] | str, what: str = "folder") -> Iterator[Path]:
    """``path``, when it is a folder, as :func:`fd_path` of one ``O_NOFOLLOW | O_DIRECTORY`` descriptor.

    Everything read or written below the result goes through that one descriptor (the folder
    renamed and replaced by a link meanwhile changes nothing). A path that is not a folder (a
    report.json, a missing path) is given back as it is; a link to a folder is refused in one line,
    like a linked report.json, since another user may have planted it.
    """
    fd = None if is_pinned(path) or not _FD_FOLDER.is_dir() else _folder_or_none(path, what)
    if fd is None:
        yield Path(path)
        return
    try:
        yield fd_path(fd)
    except UserError as exc:  # said with the folder's own name, not /proc/self/fd/N
        raise UserError(str(exc).replace(str(fd_path(fd)), os.fspath(path)), exc.exit_code) from None
    finally:
        os.close(fd)


def _folder_or_none(path: os.PathLike[str] | str, what: str) -> int | None:
    try:
        return open_folder(path)
    except UnsafeFile as exc:
        if "not a folder" in str(exc):
            return None
        raise UserError(f"refusing {what} {path}: it is a symbolic link, which gpudoctor never reads or "
                        "writes through; pass the folder it points to") from None
    except OSError:  # missing, unreadable: the caller says so in its own words
        return None


def is_holey(st: os.stat_result, slack: int = 2**20) -> bool:
    """Whether a file claims far more bytes than it holds on disk (a sparse file).

    Reading it would mean gigabytes of zeros for a few blocks; gpudoctor never writes one.
    """
    return st.st_size > slack and st.st_blocks * 512 + slack < st.st_size // 2


def private_dir(path: os.PathLike[str] | str, what: str = "--out") -> Path:
    """Create ``path`` 0700, or accept an existing folder only when it is safe to write into.

    An existing one must be a real directory (not a link), owned by the doctor's user and
    writable by nobody else; else one :class:`UserError` line says what to do.
    """
    folder = Path(path)
    try:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)  # FileExistsError here: a file above
            folder.mkdir(mode=0o700)
            return folder
        except FileExistsError:
            st = os.lstat(folder)
    except OSError as exc:
        raise UserError(f"cannot create {what} {folder}: {exc.strerror or exc}; choose a writable folder") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{what} {folder} exists and is not a folder (a link or a file); choose another path")
    if st.st_uid != os.geteuid():
        raise UserError(f"{what} {folder} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); "
                        "choose a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UserError(f"{what} {folder} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                        "choose a private folder, or chmod go-w it")
    return folder


def open_private_folder(path: os.PathLike[str] | str, what: str = "--out") -> int:
    """``path`` as a private folder of the doctor's user, opened once (``O_NOFOLLOW``); caller closes it.

    The folders above it are walked by :func:`open_parent` (none another user can write; missing
    ones are created). ``path`` is created 0700 through the parent's descriptor, or, when it exists,
    must be a real folder of the doctor's user that nobody else can write. Any refusal is one
    :class:`UserError` line. Write into the result through its descriptor (``dir_fd``,
    :func:`fd_path`), never by its path again.
    """
    full = Path(os.path.abspath(os.fspath(path)))
    if full == full.parent:
        raise UserError(f"{what} {path} is the root folder; choose a folder of its own")
    parent = open_parent(full.parent, what, shown=path)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(full.name, 0o700, dir_fd=parent)
        fd = open_folder(full.name, dir_fd=parent)
    except UnsafeFile:
        raise UserError(f"{what} {path} exists and is not a folder (a link or a file); choose another path") from None
    except OSError as exc:
        raise UserError(f"cannot create {what} {path}: {exc.strerror or exc}; choose a writable folder") from None
    finally:
        os.close(parent)
    st = os.fstat(fd)
    why = None
    if st.st_uid != os.geteuid():
        why = (f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); "
               "choose a folder of your own")
    elif st.st_mode & _OTHERS_WRITE:
        why = (f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
               "choose a private folder, or chmod go-w it")
    if why is not None:
        os.close(fd)
        raise UserError(why)
    return fd


def open_parent(path: os.PathLike[str] | str, what: str = "--out", shown: os.PathLike[str] | str | None = None) -> int:
    """Folder ``path``, where a run folder goes, walked from ``/`` and opened; caller closes it.

    Each folder on the way is opened ``O_NOFOLLOW | O_DIRECTORY`` relative to the one before and
    checked on its descriptor: it must be root's or the doctor's user's and writable by no other
    user, unless sticky (``/tmp``). A link on the way is followed only when root or the doctor's user
    made it. A missing folder is created (0755 at most) the same way. Otherwise another user could
    rename the run folder and put a link in its place: one :class:`UserError` line, ``refusing
    {what} {shown}: ...``, names the folder and the way out (``--out`` in a folder of one's own).
    """
    full = os.path.abspath(os.fspath(path))
    parts = [p for p in full.split("/") if p]
    fd = os.open("/", _FOLDER_FLAGS)
    walked: list[str] = []
    links = 0
    try:
        _above(fd, "/", what, shown or path)
        while parts:
            name = parts.pop(0)
            where = "/" + "/".join([*walked, name])
            nfd, target = _step(fd, name, where, what, shown or path)
            if target is not None:
                links += 1
                if links > _MAX_LINKS:
                    raise UserError(f"cannot reach {shown or path}: too many links on the way")
                if target.startswith("/"):
                    os.close(fd)
                    fd, walked = os.open("/", _FOLDER_FLAGS), []
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            os.close(fd)
            fd = nfd
            walked = walked[:-1] if name == ".." else [*walked, name] if name != "." else walked
            _above(fd, "/" + "/".join(walked), what, shown or path)
        kept, fd = fd, -1
        return kept
    except OSError as exc:
        raise UserError(f"cannot create {shown or path}: {exc.strerror or exc}; "
                        "choose a writable folder with --out") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _step(fd: int, name: str, where: str, what: str, shown: os.PathLike[str] | str) -> tuple[int, str | None]:
    """Open ``name`` below ``fd`` (creating it when missing): (its descriptor, None), or (-1, a link's target)."""
    for _ in range(2):
        try:
            return os.open(name, _FOLDER_FLAGS, dir_fd=fd), None
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.lstat(name, dir_fd=fd)
            if not stat.S_ISLNK(st.st_mode):
                raise UserError(f"cannot create {shown}: {where} is not a folder; choose another --out") from None
            if st.st_uid not in (0, os.geteuid()):
                raise UserError(_unsafe(what, shown, f"{where} is a link made by uid {st.st_uid}")) from None
            return -1, os.readlink(name, dir_fd=fd)
    return os.open(name, _FOLDER_FLAGS, dir_fd=fd), None


def _above(fd: int, where: str, what: str, shown: os.PathLike[str] | str) -> None:
    st = os.fstat(fd)
    if st.st_uid not in (0, os.geteuid()):
        raise UserError(_unsafe(what, shown, f"{where} belongs to uid {st.st_uid}"))
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        raise UserError(_unsafe(what, shown, f"{where} is writable by other users "
                                             f"(mode {stat.S_IMODE(st.st_mode):o})"))


def _unsafe(what: str, shown: os.PathLike[str] | str, why: str) -> str:
    return (f"refusing {what} {shown}: {why}, who could swap the run folder for a link; "
            "choose an --out whose folders only you or root can write (e.g. --out ~/gpudoctor-reports/run)")


def lstat_regular(path: os.PathLike[str] | str) -> Any:
    """``os.lstat`` if ``path`` is a regular file (not a link, FIFO, device or folder), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None
