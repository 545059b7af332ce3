"""The trial writes its own copies of what the baseline wrote, so ``try`` leaves the baseline's outputs as they were.

Both runs are the user's command. A path on its command line that the baseline created or rewrote
(a metrics file, a log, an output folder it made) is one of its outputs; run again as given, the
trial would overwrite it, and what the user (or a program reading it after ``try``) finds there
would describe the trial with the fix, not the run they asked about. So the trial gets that
argument pointed into its own folder (``trial/outputs/``):

* a file or folder the baseline created starts absent there, as it did for the baseline; so does
  a path that looks like a file's (a folder in it, or an extension) and was still absent when the
  baseline ended (stopped after its seconds, before it wrote what it writes at the end);
* a file that was there before and was rewritten is copied there first (up to a budget), so the
  trial reads what a second run of the command would;
* a folder that was there before is left as it is (it may hold the inputs), and said;
* a pattern (``data/*.json``) and the prefix of files that were there (``data/corpus`` beside
  ``data/corpus.bin``) are inputs, left as they are.

Only what the command line names is seen: paths the script builds itself are its own business,
and the report's note says so. Links, and files another user owns, are never followed or copied.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.common import safefs

COPY_BUDGET_BYTES = 256 * 2**20  # rewritten files copied for the trial, in all; a larger one is left shared
_MAX_ARG_CHARS = 4096
_MAX_LISTED = 100_000  # names read from one folder to tell an input's prefix; past it, taken as one
_GLOB = "*?["


@dataclass(frozen=True)
class Seen:
    """One path named on the command line, as it stood before the baseline."""

    text: str  # the path as the command line spells it
    path: Path  # resolved against the folder the command runs in
    kind: str | None  # "file", "folder" or None (absent)
    stamp: tuple[int, int, int] | None  # (inode, size, mtime_ns); None when absent
    prefix: bool = False  # absent, but names beside it start with it: an input's prefix (data/corpus -> corpus.bin)


@dataclass(frozen=True)
class Output:
    """A path the baseline wrote, and where the trial's own copy goes."""

    text: str
    kind: str  # "file", "folder" or "path" (not written yet: which one is not known)
    how: str  # "created", "rewritten" or "unwritten"
    trial: Path | None  # None: left shared (a folder that was there before, a file over the budget)


def _value(token: str) -> str | None:
    """The path-like value of one argument: ``--out=x`` -> ``x``, ``x`` -> ``x``, a bare flag -> None."""
    if token.startswith("-"):
        _, eq, value = token.partition("=")
        return value if eq else None
    return token


def _look(path: Path) -> tuple[str | None, tuple[int, int, int] | None, int | None]:
    """(kind, (inode, size, mtime_ns), owner uid) of ``path``, never following a link."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None, None, None
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if stat.S_ISDIR(st.st_mode):
        return "folder", stamp, st.st_uid
    if stat.S_ISREG(st.st_mode):
        return "file", stamp, st.st_uid
    return "other", None, st.st_uid  # a link, a FIFO, a device: never redirected


def before(command: list[str], cwd: Path | None = None) -> list[Seen]:
    """The command line's path-like arguments (the program excepted), as they stand now."""
    where = cwd or Path.cwd()
    seen: list[Seen] = []
    for token in command[1:]:
        value = _value(token)
        if (not value or len(value) > _MAX_ARG_CHARS or "\0" in value or value in {s.text for s in seen}
                or any(c in value for c in _GLOB)):  # a pattern names inputs the trial must read as they are
            continue
        path = where / value
        if not path.parent.is_dir():  # not a path at all ("longest", "0.5"), or one whose folder is missing
            continue
        kind, stamp, _ = _look(path)
        seen.append(Seen(value, path, kind, stamp, kind is None and _prefix_of_others(path)))
    return seen


def written(seen: list[Seen], folder: Path) -> list[Output]:
    """What the baseline created or rewrote of ``seen``, each with the trial's own path under ``folder``."""
    outs: list[Output] = []
    budget = COPY_BUDGET_BYTES
    for i, s in enumerate(seen):
        kind, stamp, owner = _look(s.path)
        own = folder / f"{i}-{s.path.name or 'out'}"
        if s.kind is None and kind is None and _file_like(s.text) and not s.prefix:
            outs.append(Output(s.text, "path", "unwritten", own))
            continue
        if kind not in ("file", "folder") or owner != os.geteuid():
            continue
        if s.kind is None:
            outs.append(Output(s.text, kind, "created", own))
        elif s.kind == kind and stamp != s.stamp and stamp is not None:
            fits = kind == "file" and stamp[1] <= budget and _copy(s.path, own)
            budget -= stamp[1] if fits else 0
            outs.append(Output(s.text, kind, "rewritten", own if fits else None))
    return outs


def _prefix_of_others(path: Path) -> bool:
    """Whether names in ``path``'s folder start with its name (``corpus_text_document`` beside
    ``corpus_text_document.bin``): a prefix the script reads files by; unknown (a folder too large
    to list) counts as one."""
    name = path.name
    try:
        with os.scandir(path.parent) as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_LISTED or (name and entry.name.startswith(name)):
                    return True
    except OSError:
        return True
    return False


def _file_like(text: str) -> bool:
    """A path, not a word or a number: it holds a folder (``out/m.json``) or ends in an extension
    that starts with a letter (``metrics.json``, not ``0.5``)."""
    return "/" in text or re.search(r"\.[A-Za-z][A-Za-z0-9]{0,9}$", text) is not None


def _copy(src: Path, dst: Path) -> bool:
    """Copy a regular file of ours without following a link; False when it cannot be."""
    dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        with safefs.open_read(src, owner=os.geteuid()) as fh:
            fd = safefs.create_new(dst)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(fh, out)
        shutil.copymode(src, dst, follow_symlinks=False)
    except OSError:
        return False
    return True


def redirect(command: list[str], outs: list[Output]) -> list[str]:
    """``command`` with each output the trial has its own copy of pointed there (``--x=path`` kept as such)."""
    moved = {o.text: o.trial for o in outs if o.trial is not None}
    for trial in moved.values():
        trial.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    edited = command[:1]
    for token in command[1:]:
        value = _value(token)
        if value is not None and value in moved:
            token = token[: len(token) - len(value)] + str(moved[value])
        edited.append(token)
    return edited
