"""Untrusted text made safe to print on a terminal or in a CI log: the one sanitiser.

The doctor prints strings it did not write: a report.json may come from anyone (``check``
prints its rule names where CI reads them), and the patient's own strings (its script's
flags, quoted by a fix's summary; exception text; paths of files it mapped) reach root's
terminal under ``attach``. A newline would forge a second log line, an ANSI/OSC escape could
rewrite the screen, retitle the window or write the clipboard (``ESC]52;c;...``), and a line
starting with ``::`` is a GitHub Actions workflow command (``::error``, ``::add-mask::``, ...).
Only printable text survives. Every line the doctor prints goes through :func:`say` (or, for
rich's panels, :func:`terminal_text`); :func:`terminal_safe` cuts one field to a short length.
"""

from __future__ import annotations

import re
import sys
from typing import IO

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, and their
# 8-bit C1 forms; what is left of a broken sequence is removed as control characters.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-Z\\-_]"
)


def _printable(line: str) -> str:
    """``line`` with escape sequences and every non-printable character removed."""
    if line.isprintable():  # in C: the common case, a line of our own
        return line
    return "".join(c for c in _ESCAPES.sub("", line) if c.isprintable())


def terminal_line(line: str) -> str:
    """One line: escapes and control characters removed, a leading ``::`` (after its indent) dropped."""
    line = _printable(line)
    body = line.lstrip()
    if body.startswith("::"):
        line = line[: len(line) - len(body)] + body.lstrip(":")
    return line


def terminal_text(text: object) -> str:
    """``text`` whole, any length: its line breaks kept, each line made a :func:`terminal_line`."""
    return "\n".join(terminal_line(line) for line in str(text).split("\n"))


def say(*parts: object, file: IO[str] | None = None, end: str = "\n", flush: bool = False) -> None:
    """``print`` for everything the doctor tells a terminal (stderr unless ``file``), sanitised."""
    text = terminal_text(" ".join(map(str, parts)))
    stream = file if file is not None else sys.stderr
    # ONE write, the line end included: print() writes it apart, and the training's own output on the
    # same terminal (a traceback after Ctrl-C) then ran into the line ("...recorded.Traceback")
    stream.write(text + end)
    if flush:
        stream.flush()


def terminal_safe(text: object, limit: int = 80) -> str:
    """``text`` as one short field: escapes and non-printable characters (line breaks too)
    removed, no leading ``::``, at most ``limit`` characters."""
    clean = _printable(str(text))
    clean = clean.lstrip(":").strip()
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return clean or "?"
