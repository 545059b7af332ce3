"""Load a report from a run folder (re-analysed) or a saved report.json.

A report.json may come from anyone (a CI artifact, a pull request): it is opened
through :mod:`gpudoctor.safefs` (no link, no FIFO), refused past
:data:`MAX_REPORT_BYTES` before it is parsed (a real one is well under 1 MiB), and
its figures are range-checked, so the renderers and the CI gate get bounded,
sane input or one clear line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudoctor import safefs
from gpudoctor.errors import UserError
from gpudoctor.report_schema import SCHEMA, SEVERITIES

MAX_REPORT_BYTES = 32 * 2**20
MAX_USD = 1e9  # per hour or per run: beyond it the figure is forged or corrupt
MAX_SECONDS = 1e8  # ~3 years of wall time


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
    return data


def _folder_owner(path: Path) -> int | None:
    try:
        return os.stat(path.parent).st_uid
    except OSError:
        return None


def load_report(path: Path, price: float | None = None, gpus: int | None = None) -> dict[str, Any]:
    if path.is_dir():
        if (path / "meta.json").exists() or (path / "events").is_dir() or (path / "samples").is_dir():
            from gpudoctor.recording.store import load_recording
            from gpudoctor.report import ReportOptions, build_report

            report = build_report(load_recording(path), ReportOptions(price_per_gpu_hour=price, gpus=gpus))
            saved = path / "report.json"
            if saved.exists():  # keep sections other commands added (replay preflight, sweep)
                try:
                    old = json.loads(read_report_bytes(saved, _folder_owner(saved)))
                except (UserError, ValueError, RecursionError):  # unsafe, huge, truncated: rebuilt anyway
                    old = {}
                for key in ("preflight", "sweep", "trial"):
                    if isinstance(old, dict) and key in old:
                        report[key] = old[key]
            return report
        if (path / "report.json").exists():
            path = path / "report.json"
            owner = _folder_owner(path)  # inside a folder: its owner's file (or ours), never a planted one
        else:
            raise UserError(f"{path} holds no recording or report.json; pass a folder written by gpudoctor")
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
    missing = [k for k in ("run", "breakdown", "findings", "cost", "verdict") if k not in report]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; it may be truncated — re-render from its run folder")
    problem = shape_problem(report)
    if problem:
        raise UserError(f"{path} does not match {SCHEMA}: {problem}; re-render it from its run folder")
    return report


def _is_num(v: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and low <= v <= high


_COST_FIGURES = ("usd_per_hour", "wasted_usd_per_hour", "wasted_usd_so_far", "projected_run_hours",
                 "projected_run_usd", "projected_wasted_usd")


_TRIAL_FIGURES = ("predicted_speedup", "achieved_speedup", "baseline_steps_per_s", "trial_steps_per_s")
MAX_SPEEDUP = 1e6  # also the most steps/s: beyond it the figure is forged or corrupt


def _is_fraction(v: Any) -> bool:
    return _is_num(v, 0.0, 1.0)


def shape_problem(report: dict[str, Any]) -> str | None:
    """What is wrong with the SPEC sections every command reads, or None.

    Fractions must lie in [0, 1], money and seconds be >= 0 and not absurd: a forged
    ``wasted_fraction`` of -3 would pass the CI gate, a 1e308 would overflow the renderers.
    """
    for key in ("run", "breakdown", "cost", "shares", "padding", "steps"):
        if key in report and not isinstance(report[key], dict):
            return f"'{key}' is not an object"
    if not isinstance(report["verdict"], str):
        return "'verdict' is not a string"
    bad = [k for k, v in report["breakdown"].items() if v is not None and not _is_fraction(v)]
    if bad:
        return f"breakdown.{bad[0]} is not a fraction of the wall time (0 to 1)"
    wasted = report["cost"].get("wasted_fraction")
    if wasted is not None and not _is_fraction(wasted):
        return "cost.wasted_fraction is not a fraction of the wall time (0 to 1)"
    for key in _COST_FIGURES:
        value = report["cost"].get(key)
        if value is not None and not _is_num(value, 0.0, MAX_USD):
            return f"cost.{key} is not a number from 0 to {MAX_USD:g}"
    duration = report["run"].get("duration_s")
    if duration is not None and not _is_num(duration, 0.0, MAX_SECONDS):
        return f"run.duration_s is not a number of seconds from 0 to {MAX_SECONDS:g}"
    if not isinstance(report["findings"], list):
        return "'findings' is not a list"
    trial = report.get("trial")
    if trial is not None and not isinstance(trial, dict):
        return "'trial' is not an object"
    for key in _TRIAL_FIGURES if isinstance(trial, dict) else ():
        value = trial.get(key)
        if value is not None and not _is_num(value, 0.0, MAX_SPEEDUP):
            return f"trial.{key} is not a number from 0 to {MAX_SPEEDUP:g}"
    for i, f in enumerate(report["findings"]):
        if not isinstance(f, dict) or not isinstance(f.get("rule"), str) or f.get("severity") not in SEVERITIES:
            return f"findings[{i}] lacks a rule name or a severity"
        if not _is_fraction(f.get("waste_fraction")) or not isinstance(f.get("fix"), dict):
            return f"findings[{i}] lacks a waste_fraction from 0 to 1 or a fix"
        usd = f.get("waste_usd_per_hour")
        if usd is not None and not _is_num(usd, 0.0, MAX_USD):
            return f"findings[{i}].waste_usd_per_hour is not a number from 0 to {MAX_USD:g}"
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
