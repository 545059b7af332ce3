"""One pipeline from a run folder to its report: every mode ends here.

``run``, ``attach``, ``replay``, ``try``, sweep trials, ``gpudoctor.profile()`` and the
Trainer/Lightning callbacks all record into a run folder and then call :func:`finish`:
recording -> analysis -> rules -> ``Report`` -> ``report.json/.html/.md``. A live run
and ``gpudoctor report FOLDER`` later give the same report.
"""

from __future__ import annotations

from pathlib import Path

from gpudoctor.core.schema import Added, Report
from gpudoctor.recording.store import load_recording
from gpudoctor.render import write_all
from gpudoctor.report.build import Diagnosis, ReportOptions, diagnose
from gpudoctor.trackers import add_to_trackers


def finish(folder: Path, options: ReportOptions, *, extra: Added | None = None,
           trackers: bool = False, shown: Path | None = None) -> Report:
    """:func:`conclude`'s report."""
    return conclude(folder, options, extra=extra, trackers=trackers, shown=shown).report


def conclude(folder: Path, options: ReportOptions, *, extra: Added | None = None,
             trackers: bool = False, shown: Path | None = None) -> Diagnosis:
    """Analyse the folder's recording and write report.json/html/md into it (0600, by rename).

    ``folder``: best the run folder's held descriptor (:attr:`RunFolder.at`), which every read and
    write goes through; ``shown``: its name for people (what a tracker run is told), when different.

    ``extra``: sections a mode adds beside the analysis (replay's preflight, try's trial).
    ``trackers``: then add the figures to the MLflow / W&B / TensorBoard runs the training logged to
    (``run``, ``attach`` and the in-process API; docs/trackers.md).
    """
    recording = load_recording(folder)
    diagnosis = diagnose(recording, options)
    report = diagnosis.report
    if extra:
        report.update(extra)  # type: ignore[typeddict-item]  # strict's extra_checks: Added's keys are the report's own
    write_all(report, folder)
    if trackers and add_to_trackers(report, shown or folder, {pid: r.trackers for pid, r in recording.events.items()},
                                   recording.event_owners):
        write_all(report, folder)  # now saying where its figures went
    return diagnosis


def add_sections(report: Report, folder: Path, extra: Added) -> Report:
    """A mode's own sections (replay's preflight) added to a report already built and written:
    written again, the recording not analysed again."""
    report.update(extra)  # type: ignore[typeddict-item]  # strict's extra_checks: Added's keys are the report's own
    write_all(report, folder)
    return report
