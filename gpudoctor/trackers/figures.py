"""What the doctor adds to a tracker run, taken from the report: the same figures for every tracker.

Metric names are ``gpudoctor/...`` so they sort together beside the training's own; a figure the
report could not observe (null) is left out, never sent as 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.core.schema import BREAKDOWN_KEYS, Report

PREFIX = "gpudoctor"
TOP_FINDINGS = 10
COLUMNS = ("rule", "severity", "waste_fraction", "waste_usd_per_hour", "predicted_speedup", "fix")
MAX_CELL = 300  # a fix's summary, shortened: the table is an overview, report.html has the rest


@dataclass
class Figures:
    metrics: dict[str, float] = field(default_factory=dict)
    rows: list[list[Any]] = field(default_factory=list)  # the top findings, in COLUMNS order
    verdict: str = ""
    step: int = 0  # the run's last optimizer step, where TensorBoard puts the figures

    @classmethod
    def of(cls, report: Report) -> Figures:
        figures = cls(verdict=str(report.get("verdict") or ""))
        breakdown = _dict(report.get("breakdown"))
        for key in BREAKDOWN_KEYS:
            figures._put(f"breakdown/{key}", breakdown.get(key))
        cost = _dict(report.get("cost"))
        for key in ("wasted_fraction", "usd_per_hour", "wasted_usd_per_hour", "wasted_usd_so_far"):
            figures._put(key, cost.get(key))
        figures._put("wall_s", _dict(report.get("run")).get("duration_s"))
        findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
        figures._put("findings", len([f for f in findings if f.get("severity") != "info"]))
        figures.rows = [_row(f) for f in findings[:TOP_FINDINGS]]
        count = _number(_dict(report.get("steps")).get("count"))
        figures.step = int(count) if count is not None and count > 0 else 0
        return figures

    def _put(self, name: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            self.metrics[f"{PREFIX}/{name}"] = float(value)

    def markdown(self) -> str:
        """The findings as a Markdown table (TensorBoard's text tab renders it)."""
        head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
        body = "".join("| " + " | ".join(_cell(v) for v in row) + " |\n" for row in self.rows)
        return f"{_cell(self.verdict)}\n\n" + (head + body if self.rows else "no findings")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _row(finding: Mapping[str, Any]) -> list[Any]:
    summary = str(_dict(finding.get("fix")).get("summary") or "")
    if len(summary) > MAX_CELL:
        summary = summary[: MAX_CELL - 3] + "..."
    return [str(finding.get("rule") or ""), str(finding.get("severity") or ""),
            _number(finding.get("waste_fraction")), _number(finding.get("waste_usd_per_hour")),
            _number(finding.get("predicted_speedup")), summary]


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _cell(value: Any) -> str:
    text = "" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
    return " ".join(text.replace("|", "\\|").split())
