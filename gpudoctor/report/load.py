"""Load a report from a run folder (re-analysed) or a saved report.json.

One loader below the commands, so ``gpudoctor report``/``diff``/``check`` and the notebook API
(:func:`gpudoctor.load`) check a report the same way. A report.json may come from anyone (a CI
artifact, a pull request): it is opened through :mod:`gpudoctor.common.safefs` (no link, no FIFO),
refused past :data:`MAX_REPORT_BYTES` or :data:`MAX_REPORT_VALUES` before it is parsed (a real one is
well under 1 MiB and 100,000 values: bytes alone do not bound memory, as ``[],`` is 3 bytes on disk
and ~64 parsed, so 32 MiB of them would take 700 MB), and its figures are range-checked, so the renderers and the CI gate get bounded, sane input or one
clear line. The check is :class:`gpudoctor.core.schema.Report` itself
(:func:`gpudoctor.report.check.problem`), so what is checked and what the schema says are one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.core.schema import KEPT_ON_RERENDER, REQUIRED, SCHEMA, Report, Sections
from gpudoctor.recording.read import folder_owner
from gpudoctor.report.check import problem

if TYPE_CHECKING:
    from gpudoctor.recording.store import Recording

MAX_REPORT_BYTES = 32 * 2**20
MAX_REPORT_VALUES = 2_000_000  # JSON values, counted by their separators: parsed, at most ~150 MB


def read_report_bytes(path: Path, owner: int | None = None, limit: int = MAX_REPORT_BYTES) -> bytes:
    """``path``'s bytes, read safely; a link, FIFO, stranger's file or one over ``limit`` is one line."""
    try:
        with safefs.open_read(path, owner) as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(limit + 1) if size <= limit else b""
    except FileNotFoundError:
        raise UserError(f"no such file or folder: {path}") from None
    except safefs.UnsafeFile as exc:
        raise UserError(f"refusing to read {path}: {str(exc).replace(str(path), 'it')}; "
                        "pass the regular file itself") from None
    except OSError as exc:  # a folder, an I/O error
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size > limit or len(data) > limit:
        raise UserError(f"{path} is {max(size, len(data)) / 2**20:.0f} MiB, over the {limit // 2**20} MiB cap "
                        "for a report.json (a real one is under 1 MiB); re-render it from its run folder "
                        "with 'gpudoctor report FOLDER'")
    values = data.count(b",") + data.count(b"[") + data.count(b"{")  # in C; separators in strings count too
    if values > MAX_REPORT_VALUES:
        raise UserError(f"{path} holds about {values:,} JSON values, over the {MAX_REPORT_VALUES:,} a report.json "
                        "is parsed with (a real one holds under 100,000); re-render it from its run folder "
                        "with 'gpudoctor report FOLDER'")
    return data


def holds_recording(path: Path) -> bool:
    """Whether ``path`` is a run folder with a recording (not only a report.json)."""
    return path.is_dir() and ((path / "meta.json").exists() or (path / "events").is_dir()
                              or (path / "samples").is_dir())


def load_report(path: Path, price: float | None = None, gpus: int | None = None) -> Report:
    """The report of a run folder (re-analysed from its recording) or of a saved report.json.

    A folder is opened once (``O_NOFOLLOW``) and read through that descriptor
    (:func:`gpudoctor.common.safefs.pinned_folder`): one swapped for a link meanwhile changes nothing.
    """
    with safefs.pinned_folder(path) as pinned:
        if holds_recording(pinned):
            # only a run folder needs the analysis: report/diff/check of a report.json stay light
            from gpudoctor.recording.store import load_recording

            return report_of_recording(load_recording(pinned), price, gpus)
        return read_report(pinned)


def report_of_recording(rec: Recording, price: float | None = None, gpus: int | None = None) -> Report:
    """``rec`` analysed into its report, with the sections a mode added kept from its report.json."""
    from gpudoctor.report.build import (  # the analysis: only for a recording
        ReportOptions,
        build_report,
    )

    report = build_report(rec, ReportOptions(price_per_gpu_hour=price, gpus=gpus))
    saved = rec.root / "report.json"
    if saved.exists():
        # strict's extra_checks: a Sections value might carry other keys; this one holds only KEPT_ON_RERENDER
        report.update(_kept_sections(saved))  # type: ignore[typeddict-item]
    return report


def read_report(path: Path) -> Report:
    """A saved report.json (or a folder's), read safely and validated against the schema."""
    if path.is_dir():
        if not (path / "report.json").exists():
            raise UserError(f"{path} holds no recording or report.json; pass a folder written by gpudoctor")
        path = path / "report.json"
        owner = folder_owner(path)  # inside a folder: its owner's file (or ours), never a planted one
    else:
        owner = None  # a file named on the command line: whoever wrote it, the user chose it
    raw = read_report_bytes(path, owner)
    try:
        report = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); it may be truncated — "
                        "re-render it from its run folder with 'gpudoctor report FOLDER'") from None
    except (OSError, ValueError, RecursionError) as exc:  # a folder, bad UTF-8, nested too deep, huge ints
        raise UserError(f"cannot read {path}: {str(exc)[:200]}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise UserError(f"{path} is not a gpudoctor report (schema {str(found)[:80]!r}, expected {SCHEMA!r}); "
                        "re-render it with this version: gpudoctor report RUN_FOLDER")
    missing = [k for k in REQUIRED if k not in report]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; it may be truncated — re-render from its run folder")
    wrong = problem(report)
    if wrong:
        raise UserError(f"{path} does not match {SCHEMA}: {wrong}; re-render it from its run folder")
    return cast(Report, report)  # the one boundary: validated against Report just above


def _kept_sections(saved: Path) -> Sections:
    """The sections a mode added beside the analysis (:data:`~gpudoctor.core.schema.SECTIONS`
    marked ``kept``: replay's preflight and prediction_check, try's trial), from the folder's
    report.json, each only when it still matches the schema; the recording rebuilds the rest."""
    try:
        old = json.loads(read_report_bytes(saved, folder_owner(saved)))
    except (UserError, ValueError, RecursionError):  # unsafe, huge, truncated: rebuilt without them
        return {}
    if not isinstance(old, dict) or old.get("schema") != SCHEMA:
        return {}
    kept = {key: old[key] for key in KEPT_ON_RERENDER if key in old and problem({key: old[key]}, Sections) is None}
    return cast(Sections, kept)  # each kept section validated against Sections just above
