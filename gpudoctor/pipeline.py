"""One pipeline from a run folder to its report: every mode ends here.

``run``, ``attach``, ``replay``, ``try``, sweep trials, ``gpudoctor.profile()`` and the
Trainer/Lightning callbacks all record into a run folder and then call :func:`finish`:
recording -> analysis -> rules -> report dict -> ``report.json/.html/.md``. A live run
and ``gpudoctor report FOLDER`` later give the same report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudoctor.recording.store import load_recording
from gpudoctor.render import write_all
from gpudoctor.report import ReportOptions, build_report


def finish(folder: Path, options: ReportOptions, *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Analyse the folder's recording and write report.json/html/md into it (0600, by rename).

    ``extra``: sections a mode adds beside the analysis (replay's preflight, try's trial).
    """
    report = build_report(load_recording(folder), options)
    if extra:
        report.update(extra)
    write_all(report, folder)
    return report
