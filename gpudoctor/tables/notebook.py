"""What Jupyter shows for a loaded run: the report's headline and breakdown, escaped.

Every string from the report (verdict, command, a slice name from a foreign report.json) goes
through :func:`html.escape`; the breakdown bar is the report page's own SVG of numbers.
"""

from __future__ import annotations

from html import escape

from gpudoctor.core.schema import Report
from gpudoctor.render.base import (
    breakdown_items,
    command_text,
    fmt_duration,
    fmt_int,
    fmt_pct,
    fmt_usd,
)
from gpudoctor.render.charts import SPAN_LABELS, breakdown_bar_svg


def summary_html(report: Report, sizes: dict[str, int], notes: list[str]) -> str:
    run, cost = report.get("run") or {}, report.get("cost") or {}
    duration = run.get("duration_s")
    rows = "".join(
        f"<tr><td>{escape(SPAN_LABELS.get(key, key))}</td><td style='text-align:right'>{fmt_pct(frac)}</td>"
        f"<td style='text-align:right'>{fmt_duration(frac * duration) if frac is not None and duration else ''}"
        "</td></tr>"
        for key, frac in breakdown_items(report.get("breakdown")))
    wasted = f"wasted {fmt_pct(cost.get('wasted_fraction'))} of wall time"
    if cost.get("wasted_usd_per_hour") is not None:
        wasted += f" ({fmt_usd(cost.get('wasted_usd_per_hour'))}/hour)"
    line = " · ".join(escape(x) for x in (command_text(run.get("command")) or "(no command recorded)",
                                           str(run.get("status") or "finished"), fmt_duration(duration), wasted))
    tables = ", ".join(f"<code>.{name}</code> ({fmt_int(n)} rows)" for name, n in sizes.items())
    notes_html = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return (
        "<div class='gpudoctor-run'>"
        f"<h4>gpudoctor: {escape(str(report.get('verdict') or 'no verdict'))}</h4>"
        f"<p>{line}</p>"
        f"<div style='max-width:640px'>{breakdown_bar_svg(report.get('breakdown'), height=22)}</div>"
        "<table><thead><tr><th>slice</th><th>share</th><th>time</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f"<p>Tables: {tables}; <code>.report</code> is the report dict.</p>"
        + (f"<ul>{notes_html}</ul>" if notes_html else "")
        + "</div>"
    )
