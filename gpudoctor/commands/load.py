"""Load a report for ``report``/``diff``/``check``: :mod:`gpudoctor.report_load`, plus the guard
that turns a renderer's crash on an odd report.json into one line.

The loader itself lives below the commands so the notebook API (:func:`gpudoctor.load`) checks a
report the same way; its names are re-exported here for the commands and their tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpudoctor.errors import UserError
from gpudoctor.report_load import MAX_REPORT_BYTES, load_report, read_report_bytes
from gpudoctor.report_schema import SCHEMA

__all__ = ["MAX_REPORT_BYTES", "load_report", "malformed_report_guard", "read_report_bytes"]


@contextmanager
def malformed_report_guard(*sources: Path) -> Iterator[None]:
    """Turn a crash on an odd report.json (a hand-edited or foreign file) into one clear line.

    Every section is validated on load (:mod:`gpudoctor.report_check`); this is the net for a
    shape the types allow that a renderer still trips on.
    ``--debug`` (or GPUDOCTOR_DEBUG=1) still shows the traceback.
    """
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        files = [str(s) for s in sources if not s.is_dir()]
        if not files:  # reports built here from a recording: a crash is our bug, keep the traceback
            raise
        raise UserError(f"{' or '.join(files)} does not match {SCHEMA} ({type(exc).__name__}: {str(exc)[:120]}); "
                        "re-render it from its run folder with 'gpudoctor report FOLDER'") from exc
