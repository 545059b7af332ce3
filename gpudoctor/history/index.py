"""Add a written report to the history: the one door the commands use, and it never fails a run.

The report is on disk before this is called; whatever goes wrong here (a refused folder, a full
disk, a database locked past every retry, a bug) is one line on stderr and the run's exit code
is unchanged. ``--no-history`` (or ``GPUDOCTOR_HISTORY=off``) skips it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.core.schema import Report
from gpudoctor.history.entry import from_report
from gpudoctor.history.store import History


def record(report: Report, folder: Path, where: Path | None, *, name: str | None = None,
           git: bool = True, quiet: bool = False) -> int | None:
    """Index ``report`` (written in ``folder``) into the history at ``where``; its id, or None when
    skipped or failed. Unless ``quiet``, one line on stderr says the id (for ``check --baseline``)."""
    if where is None:
        return None
    try:
        entry = from_report(report, folder, name=name, git=git)
        with History(where) as history:
            entry_id = history.add(entry)
    except UserError as exc:
        say(f"gpudoctor: this run was not added to the history: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # the report is written; indexing it must never fail the run
        say(f"gpudoctor: this run was not added to the history {where} ({type(exc).__name__}: {exc}); "
            f"the report is in {folder}; --no-history skips the history", file=sys.stderr)
        return None
    if not quiet:
        say(f"  history: #{entry_id} (gpudoctor history lists the runs)", file=sys.stderr)
    return entry_id
