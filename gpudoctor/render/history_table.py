"""``gpudoctor history`` as a table: one line a run, newest first, every field made terminal-safe.

The strings come from reports (a command line, a rule name, a folder) and may be anyone's: each
goes through :func:`gpudoctor.common.termtext.terminal_safe`, cut to its column. A figure the
report did not have prints as ``-``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from gpudoctor.common.termtext import terminal_safe
from gpudoctor.history.entry import Entry

MISSING = "-"
_HEADER = ("id", "when", "name", "mode", "script", "commit", "gpu", "steps/s", "waste", "top finding", "folder")


def table_lines(entries: Sequence[Entry]) -> list[str]:
    """The header and one line per entry, columns padded to their widest cell."""
    rows = [_HEADER, *(_cells(e) for e in entries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER) - 1)]
    right = {0, 7, 8}  # numbers
    lines = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row[:-1], widths, strict=True))]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def _cells(e: Entry) -> tuple[str, ...]:
    top = MISSING
    if e.top_finding:
        share = f" {100 * e.top_finding_waste:.0f}%" if e.top_finding_waste is not None else ""
        top = terminal_safe(e.top_finding, 28) + share
    return (
        str(e.id),
        time.strftime("%Y-%m-%d %H:%M", time.localtime(e.time)),
        terminal_safe(e.name, 16) if e.name else MISSING,
        terminal_safe(e.mode, 8) if e.mode else MISSING,
        terminal_safe(os.path.basename(e.script), 24) if e.script else MISSING,
        terminal_safe(e.git_commit[:8], 8) if e.git_commit else MISSING,
        terminal_safe(e.gpu, 28) if e.gpu else MISSING,
        f"{e.steps_per_s:.3g}" if e.steps_per_s is not None else MISSING,
        f"{100 * e.waste:.1f}%" if e.waste is not None else MISSING,
        top,
        terminal_safe(e.folder, 120),
    )
