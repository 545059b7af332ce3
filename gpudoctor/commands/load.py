"""Load a report from a run folder (re-analysed) or a saved report.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError
from gpudoctor.report_schema import SCHEMA


def load_report(path: Path, price: float | None = None, gpus: int | None = None) -> dict[str, Any]:
    if path.is_dir():
        if (path / "meta.json").exists() or (path / "events").is_dir() or (path / "samples").is_dir():
            from gpudoctor.recording.store import load_recording
            from gpudoctor.report import ReportOptions, build_report

            report = build_report(load_recording(path), ReportOptions(price_per_gpu_hour=price, gpus=gpus))
            saved = path / "report.json"
            if saved.exists():  # keep sections other commands added (replay preflight, sweep)
                try:
                    old = json.loads(saved.read_text())
                    for key in ("preflight", "sweep"):
                        if key in old:
                            report[key] = old[key]
                except (json.JSONDecodeError, OSError):
                    pass
            return report
        if (path / "report.json").exists():
            path = path / "report.json"
        else:
            raise UserError(f"{path} holds no recording or report.json; pass a folder written by gpudoctor")
    if not path.exists():
        raise UserError(f"no such file or folder: {path}")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); it may be truncated — "
                        "re-render it from its run folder with 'gpudoctor report FOLDER'") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise UserError(f"{path} is not a gpudoctor report (schema {found!r}, expected {SCHEMA!r}); "
                        "re-render it with this version: gpudoctor report RUN_FOLDER")
    missing = [k for k in ("run", "breakdown", "findings", "cost", "verdict") if k not in report]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; it may be truncated — re-render from its run folder")
    return report
