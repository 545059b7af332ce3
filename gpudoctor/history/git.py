"""The git commit a script was run from, read from ``.git`` files directly: git itself is never run.

Running ``git`` in a folder another user controls runs her hooks and config (``core.fsmonitor``)
as the doctor's user, who may be root. Reading ``HEAD`` and one ref is all a commit needs; every
file is read without following a link, capped in size, and only when it belongs to the doctor's
user or root (:func:`gpudoctor.common.safefs.read_bytes`); anything else gives no commit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpudoctor.common import safefs

MAX_GIT_FILE_BYTES = 2**20  # HEAD and a ref are a line; packed-refs of a large repository fit well under
MAX_DEPTH = 32  # folders walked up from the script looking for .git
_SHA = re.compile(rb"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")


def commit_of(start: Path) -> str | None:
    """The commit checked out in the repository holding ``start`` (a script or a folder), or None:
    not in a repository, or a file on the way is a link, too large, or another user's."""
    folder = Path(os.path.abspath(start))
    if not folder.is_dir():
        folder = folder.parent
    for _ in range(MAX_DEPTH):
        dot = folder / ".git"
        if os.path.lexists(dot):
            try:
                return _head_commit(_git_dir(dot))
            except (OSError, ValueError):
                return None
        if folder.parent == folder:
            return None
        folder = folder.parent
    return None


def _read(path: Path) -> bytes:
    return safefs.read_bytes(path, owner=0, limit=MAX_GIT_FILE_BYTES)


def _git_dir(dot: Path) -> Path:
    """``.git`` itself, or where a worktree's or submodule's ``.git`` file points (``gitdir: ...``)."""
    if dot.is_dir() and not dot.is_symlink():
        return dot
    line = _read(dot).decode("utf-8").strip()
    if not line.startswith("gitdir:"):
        raise ValueError(f"{dot} is not a git folder")
    target = Path(line.removeprefix("gitdir:").strip())
    return target if target.is_absolute() else dot.parent / target


def _common_dir(git_dir: Path) -> Path:
    """Where the refs live: a worktree's ``commondir`` file names the main repository's folder."""
    try:
        common = _read(git_dir / "commondir").decode("utf-8").strip()
    except FileNotFoundError:
        return git_dir
    path = Path(common)
    return path if path.is_absolute() else git_dir / path


def _head_commit(git_dir: Path) -> str | None:
    head = _read(git_dir / "HEAD").strip()
    if _SHA.match(head):  # detached
        return head.decode()
    if not head.startswith(b"ref: refs/"):
        return None
    ref = head.removeprefix(b"ref: ").decode("utf-8")
    if ".." in ref.split("/"):
        return None
    for folder in dict.fromkeys((git_dir, _common_dir(git_dir))):
        try:
            value = _read(folder / ref).strip()
        except FileNotFoundError:
            continue
        return value.decode() if _SHA.match(value) else None
    return _packed(_common_dir(git_dir), ref)


def _packed(common: Path, ref: str) -> str | None:
    """``ref`` in ``packed-refs`` (``<sha> <ref>`` a line), or None (a branch with no commit yet)."""
    try:
        data = _read(common / "packed-refs")
    except FileNotFoundError:
        return None
    wanted = ref.encode()
    for line in data.splitlines():
        sha, _, name = line.partition(b" ")
        if name == wanted and _SHA.match(sha):
            return sha.decode()
    return None
