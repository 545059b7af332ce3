"""``gpudoctor.load(PATH)``: a recorded run as pandas tables, for notebooks and platform queries.

``load`` returns a :class:`RunTables`, not the internal
:class:`gpudoctor.recording.Recording` (the analysis' input, samples as dicts): the public
object is the report plus four typed DataFrames, named for what they hold::

    run = gpudoctor.load("reports/run-20250101-120000")
    run.report      # the report dict (report.json), as `gpudoctor report` builds it
    run.samples     # host and GPU samples, one row per tick (per GPU for GPU ticks), `source` column
    run.events      # in-process spans: pid, rank, category, name, start/end in seconds since launch
    run.steps       # one row per optimizer step: data wait, compute, checkpoint and eval seconds
    run.breakdown   # one row per training process: the report's breakdown in seconds

The step and breakdown tables come from the analysis the report itself runs
(:mod:`gpudoctor.tables.rows`), so ``steps`` sums to ``breakdown`` over the time the steps cover.
Given only a report.json, the tables that need the recording are empty (same columns) and
:attr:`RunTables.notes` says why: nothing is invented from the report's summary figures.
:mod:`gpudoctor.tables.export` writes them as parquet or CSV (``gpudoctor export``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.analysis import analyze
from gpudoctor.common.safefs import pinned_folder
from gpudoctor.core.schema import Report
from gpudoctor.recording.store import load_recording
from gpudoctor.report.load import holds_recording, read_report, report_of_recording
from gpudoctor.tables import rows as R
from gpudoctor.tables.columns import COLUMNS, TABLES
from gpudoctor.tables.frames import frame, pandas
from gpudoctor.tables.notebook import summary_html

__all__ = ["TABLES", "COLUMNS", "RunTables", "load"]


@dataclass
class RunTables:
    """One run: its report and its tables (pandas DataFrames, typed, seconds since launch)."""

    name: str  # the run folder's name: the ``run`` column, so tables of many runs concatenate
    path: Path
    report: Report
    samples: Any
    events: Any
    steps: Any
    breakdown: Any
    notes: list[str] = field(default_factory=list)  # what a table lacks, and why

    @property
    def tables(self) -> dict[str, Any]:
        """Every table by name, in :data:`TABLES` order."""
        return {name: getattr(self, name) for name in TABLES}

    def _repr_html_(self) -> str:
        return summary_html(self.report, {k: len(v) for k, v in self.tables.items()}, self.notes)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.tables.items())
        return f"<gpudoctor run {self.name!r}: {self.report.get('verdict')!r}; rows {sizes}>"


def load(path: str | Path, *, price_per_gpu_hour: float | None = None, gpus: int | None = None) -> RunTables:
    """Load a run folder (re-analysed, as ``gpudoctor report`` does) or a report.json.

    ``price_per_gpu_hour`` and ``gpus`` price a run folder's report as the CLI options do.
    Bad input raises :class:`gpudoctor.common.errors.UserError` with one line naming the fix.
    """
    pandas()  # before any work: one line if it is missing
    with pinned_folder(Path(path)) as pinned:  # one descriptor for every read (SECURITY.md)
        return _load(pinned, Path(path), price_per_gpu_hour, gpus)


def _load(path: Path, shown: Path, price_per_gpu_hour: float | None, gpus: int | None) -> RunTables:
    if not holds_recording(path):
        report = read_report(path)
        where = path if path.is_dir() else path.parent
        note = (f"{shown} holds a report.json only: the {', '.join(TABLES[:-1])} and {TABLES[-1]} tables need "
                "the run folder's recording (meta.json, samples/, events/), so they are empty")
        return _tables(where.resolve().name, shown, report, R.empty_rows(), [note])
    rec = load_recording(path)
    report = report_of_recording(rec, price_per_gpu_hour, gpus)
    a = analyze(rec)
    name = path.resolve().name
    rows = {"samples": R.sample_rows(a, name), "events": R.event_rows(a, name), "steps": R.step_rows(a, name),
            "breakdown": R.breakdown_rows(a, name)}
    notes = R.sample_notes(path)
    if not a.procs:
        notes.append("no training process was measured from inside: the steps and breakdown tables are empty")
    return _tables(name, shown, report, rows, notes)


def _tables(name: str, path: Path, report: Report, rows: dict[str, R.Rows], notes: list[str]) -> RunTables:
    frames = {k: frame(k, rows[k]) for k in TABLES}
    return RunTables(name=name, path=path, report=report, notes=notes, **frames)
