"""Load a report for ``report``/``diff``/``check``: :mod:`gpudoctor.report.load`, plus the guard
that turns a renderer's crash on an odd report.json into one line.

The loader itself lives below the commands so the notebook API (:func:`gpudoctor.load`) checks a
report the same way; its names are re-exported here for the commands and their tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpudoctor.common.errors import UserError
from gpudoctor.core.schema import SCHEMA, Report
from gpudoctor.report.load import MAX_REPORT_BYTES, holds_recording, load_report, read_report_bytes

__all__ = ["MAX_REPORT_BYTES", "load_job", "load_report", "malformed_report_guard", "read_report_bytes",
           "report_source"]


def report_source(text: str, history: Path | None) -> Path:
    """What ``diff`` and ``check`` read for ``text``: the file or folder of that name when one exists,
    else the folder of the history entry with that id (``12`` or ``#12``) or ``--name``."""
    path = Path(text)
    if os.path.lexists(path) or history is None or os.sep in text:
        return path  # a missing path is said by the loader, as before
    from gpudoctor.common.termtext import terminal_safe
    from gpudoctor.history.store import History, NoHistory

    ref = text.strip().removeprefix("#")
    try:
        with History(history, create=False) as runs:
            entry = runs.get(int(ref)) if re.fullmatch(r"\d{1,18}", ref) else runs.named(text)
    except NoHistory:
        return path
    if entry is None:
        raise UserError(f"no such file or folder: {terminal_safe(text)}, nor a run id or --name in the history "
                        f"{history}; pass a run folder or report.json, or an id from 'gpudoctor history'")
    if not os.path.isdir(entry.folder):
        raise UserError(f"history run #{entry.id}'s folder {entry.folder} is gone; pass another run")
    return Path(entry.folder)


def load_job(paths: list[Path], price: float | None = None, gpus: int | None = None) -> Report:
    """One report for a multi-node job: the run folders ``gpudoctor run`` wrote on each of its nodes,
    merged (:mod:`gpudoctor.report.nodes`). A report.json cannot take part: it lacks the step ends
    the nodes' clocks are aligned on."""
    for path in paths:
        if not path.exists():
            raise UserError(f"no such file or folder: {path}")
        if not holds_recording(path):
            raise UserError(f"{path} is not a run folder: merging a job's nodes needs each node's run folder "
                            "(written by 'gpudoctor run --out DIR'), not a report.json")
    if len({p.resolve() for p in paths}) < len(paths):
        raise UserError("the same run folder is named twice; pass each node's run folder once")
    # analysis and rules load only when a job's report is built (the CLI starts fast)
    from gpudoctor.report.build import ReportOptions
    from gpudoctor.report.nodes import merge_report

    return merge_report(paths, ReportOptions(price_per_gpu_hour=price, gpus=gpus))


@contextmanager
def malformed_report_guard(*sources: Path) -> Iterator[None]:
    """Turn a crash on an odd report.json (a hand-edited or foreign file) into one clear line.

    Every section is validated on load (:mod:`gpudoctor.report.check`); this is the net for a
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
