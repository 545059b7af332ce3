"""Writing one ``-o`` file (``report -o``, ``diff -o``): 0600, never through a link.

The doctor may run as root, and ``-o`` may name a path in a folder another user can
write, where a link to ``~/.bashrc`` can be waiting. Reports quote command lines and
paths, so they are private to their owner like the run folder.
"""

from __future__ import annotations

import stat
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError


def write_output(path: Path, text: str) -> None:
    """Write ``path`` as a new 0600 file by rename; refuse a link or special file already there."""
    existing = None
    try:
        existing = path.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; choose a writable path") from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(existing.st_mode) else "not a regular file"
        raise UserError(f"-o {path} is {kind}; gpudoctor never writes through one: pass a plain file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safefs.replace_file(path, text)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; choose a writable path") from None
