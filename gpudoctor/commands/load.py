"""Load a report from a run folder (re-analysed) or a saved report.json."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError
from gpudoctor.report_schema import SCHEMA, SEVERITIES


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
                except (OSError, ValueError, RecursionError):  # truncated or garbled: rebuilt anyway
                    old = {}
                for key in ("preflight", "sweep"):
                    if isinstance(old, dict) and key in old:
                        report[key] = old[key]
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
    except (OSError, ValueError, RecursionError) as exc:  # a folder, bad UTF-8, nested too deep, huge ints
        raise UserError(f"cannot read {path}: {str(exc)[:200]}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise UserError(f"{path} is not a gpudoctor report (schema {str(found)[:80]!r}, expected {SCHEMA!r}); "
                        "re-render it with this version: gpudoctor report RUN_FOLDER")
    missing = [k for k in ("run", "breakdown", "findings", "cost", "verdict") if k not in report]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; it may be truncated — re-render from its run folder")
    problem = shape_problem(report)
    if problem:
        raise UserError(f"{path} does not match {SCHEMA}: {problem}; re-render it from its run folder")
    return report


def _is_num(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def shape_problem(report: dict[str, Any]) -> str | None:
    """What is wrong with the SPEC sections every command reads, or None."""
    for key in ("run", "breakdown", "cost", "shares", "padding", "steps"):
        if key in report and not isinstance(report[key], dict):
            return f"'{key}' is not an object"
    if not isinstance(report["verdict"], str):
        return "'verdict' is not a string"
    bad = [k for k, v in report["breakdown"].items() if v is not None and not _is_num(v)]
    if bad:
        return f"breakdown.{bad[0]} is not a number"
    for key in ("wasted_fraction", "usd_per_hour", "wasted_usd_per_hour"):
        value = report["cost"].get(key)
        if value is not None and not _is_num(value):
            return f"cost.{key} is not a number"
    if not isinstance(report["findings"], list):
        return "'findings' is not a list"
    for i, f in enumerate(report["findings"]):
        if not isinstance(f, dict) or not isinstance(f.get("rule"), str) or f.get("severity") not in SEVERITIES:
            return f"findings[{i}] lacks a rule name or a severity"
        if not _is_num(f.get("waste_fraction")) or not isinstance(f.get("fix"), dict):
            return f"findings[{i}] lacks a numeric waste_fraction or a fix"
        usd = f.get("waste_usd_per_hour")
        if usd is not None and not _is_num(usd):
            return f"findings[{i}].waste_usd_per_hour is not a number"
    return None


@contextmanager
def malformed_report_guard(*sources: Path) -> Iterator[None]:
    """Turn a crash on an odd report.json (a hand-edited or foreign file) into one clear line.

    Only the SPEC core is checked on load; sections past it (timeline, per_rank,
    ...) are trusted, and this is the net for when they should not have been.
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
