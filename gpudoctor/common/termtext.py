"""Untrusted text made safe to print on a terminal or in a CI log.

A report.json may come from anyone, and ``check`` prints its rule names where CI
reads them: a newline would forge a second log line, an ANSI/OSC escape could
rewrite the screen or a link, and a line starting with ``::`` is a GitHub Actions
workflow command (``::error``, ``::add-mask::``, ...). Only printable text survives.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, and their
# 8-bit C1 forms; what is left of a broken sequence is removed as control characters.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-Z\\-_]"
)


def terminal_safe(text: object, limit: int = 80) -> str:
    """``text`` with escapes and non-printable characters removed, no leading ``::``, at most ``limit``."""
    clean = _ESCAPES.sub("", str(text))
    clean = "".join(c for c in clean if c.isprintable())
    clean = clean.lstrip(":").strip()
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return clean or "?"
