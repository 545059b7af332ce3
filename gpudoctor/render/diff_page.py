"""The diff's pages: a Markdown PR comment and one self-contained HTML page.

Both print the display rows built here from :func:`gpudoctor.report.diff.diff_reports`'
result; a change is coloured only when its ``verdict`` is beyond the noise, and
every string from a report goes through the Markdown escapers or Jinja2's
autoescape.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.wording import bucket_text, fmt_seconds
from gpudoctor.core.schema import DIFF_STATUSES as STATUSES
from gpudoctor.core.schema import Change, Diff
from gpudoctor.render import charts
from gpudoctor.render.base import (
    SEVERITY_COLORS,
    SLICE_COLORS,
    UNAVAILABLE,
    fmt_duration,
    fmt_int,
    fmt_pct,
    fmt_speedup,
    fmt_usd,
)
from gpudoctor.render.charts import SPAN_LABELS
from gpudoctor.render.diff_words import notes as diff_notes
from gpudoctor.render.diff_words import summary_line, worded
from gpudoctor.render.html import markup, render_template
from gpudoctor.render.markdown import (
    NOTES_SHOWN,
    clip,
    details,
    fit_comment,
    left_out,
    md_code,
    md_text,
    table,
)

FINDINGS_SHOWN = 8  # more findings fold their list into <details>


def fmt_delta(value: float | None, kind: str, unit: str | None = None) -> str:
    """A signed change: seconds (in ``unit``), percentage points, dollars, a count or a rate."""
    if value is None:
        return UNAVAILABLE
    sign = "+" if value > 0 else "−" if value < 0 else "±"
    v = abs(value)
    if kind == "seconds":
        return sign + fmt_seconds(v, unit)
    if kind == "pct":
        return f"{sign}{v * 100:.1f} pp"
    if kind == "usd":
        return sign + fmt_usd(v)
    if kind == "duration":
        return sign + fmt_duration(v)
    if kind == "int":
        return sign + fmt_int(v)
    return f"{sign}{v:.2f}"


VERDICT_CLASS = {"better": "delta-good", "worse": "delta-bad"}


def _judged(delta_text: str, v: str) -> str:
    return delta_text + " (within noise)" if v == "within_noise" else delta_text


def overview_rows(d: Diff) -> list[dict[str, str]]:
    """Headline figures: label, before, after, change, and a class only beyond the noise."""
    step, rate = d["step_time_p50_s"], d["throughput_steps_per_s"]
    ratio = rate.get("ratio")
    rows = [
        _row("steps measured", d["steps"], fmt_int, fmt_delta(d["steps"]["delta"], "int")),
        _row("duration", d["duration_s"], fmt_duration, fmt_delta(d["duration_s"]["delta"], "duration")),
        _row("step time p50", step, fmt_seconds,
             _judged(fmt_delta(step["delta"], "seconds", "s"), step["verdict"]),
             VERDICT_CLASS.get(step["verdict"], "")),
        _row("throughput (steps/s)", rate, _rate,
             _judged(fmt_delta(rate["delta"], "num") + (f" ({ratio:.2f}×)" if ratio else ""),
                     rate["verdict"]),
             VERDICT_CLASS.get(rate["verdict"], "")),
        _row("wasted, share of each run's wall", d["wasted_fraction"], fmt_pct,
             fmt_delta(d["wasted_fraction"]["delta"], "pct")),
        _row("wasted $/hour", d["wasted_usd_per_hour"], lambda v: fmt_usd(v, "no price"),
             fmt_delta(d["wasted_usd_per_hour"]["delta"], "usd")),
    ]
    return rows


def _row(label: str, c: Change | dict[str, Any], fmt: Any, delta: str, cls: str = "") -> dict[str, str]:
    return {"label": label, "before": fmt(c["before"]), "after": fmt(c["after"]), "delta": delta,
            "class": cls}


def _rate(value: float | None) -> str:
    return UNAVAILABLE if value is None else f"{value:.2f}"


def breakdown_rows(d: Diff) -> list[dict[str, str]]:
    """Each bucket in seconds per step (per launch for startup), with its share of wall shown."""
    rows = []
    for key, c in d["seconds"].items():
        share: Change = d["breakdown"].get(key) or {"before": None, "after": None, "delta": None}
        rows.append(
            {
                "key": key,
                "label": SPAN_LABELS.get(key, key),
                "color": SLICE_COLORS.get(key, "#777777"),
                "before": f"{fmt_seconds(c['before'], c['unit'])} ({fmt_pct(share.get('before'))})",
                "after": f"{fmt_seconds(c['after'], c['unit'])} ({fmt_pct(share.get('after'))})",
                "delta": _judged(fmt_delta(c["delta"], "seconds", c["unit"]), c["verdict"]),
                "class": VERDICT_CLASS.get(c["verdict"], ""),
            }
        )
    return rows


STATUS_TEXT = {
    "resolved": "resolved",
    "partial": "partly resolved",
    "moved": "relabelled, not resolved",
    "gone": "no longer reported, not confirmed",
    "new": "new",
    "still_present": "still present",
}


def finding_rows(d: Diff) -> list[dict[str, Any]]:
    """One display row per finding, in status order, for both renderers."""
    rows = []
    for status in STATUSES:
        for f in d["findings"][status]:
            w = f["waste_s"]
            v = f["verdict"] if status == "still_present" else status
            cls = {"resolved": "delta-good", "new": "delta-bad"}.get(status, "")
            if status == "still_present":
                cls = VERDICT_CLASS.get(v, "")
            sp = f.get("speedup") or {}
            rows.append({
                "status": STATUS_TEXT[status]
                + (", the rest relabelled" if status == "partial" and f["moved_to"] else "")
                + (" (within noise)" if v == "within_noise" else ""),
                "key": status,
                "class": cls,
                "rules": [f["rule"], *f["moved_to"]],
                "title": f["title"],
                "severity": f["severity"] or "low",
                "waste_before": "—" if status == "new" else fmt_seconds(w["before"], f["unit"]),
                "waste_after": fmt_seconds(w["after"], f["unit"]),
                "bucket": bucket_text(f),
                "predicted": fmt_speedup(sp.get("predicted")) if sp else "",
                "achieved": fmt_speedup(sp.get("achieved")) if sp else "",
                "basis": str(sp.get("basis") or ""),
            })
    return rows


def noise_text(d: Diff) -> str:
    t = d["noise"]["threshold_s_per_step"]
    if t is None:
        return "Noise unavailable: without step times no change can be told from noise."
    nb, na = d["noise"]["before"], d["noise"]["after"]
    return (
        f"Changes within ±{fmt_seconds(t, 's/step')} are noise: estimated from the runs' own step "
        f"times (before ±{fmt_seconds(nb['noise_s'])} over {nb['steps']} steps, after "
        f"±{fmt_seconds(na['noise_s'])} over {na['steps']})."
    )


def render_diff_markdown(d: Diff) -> str:
    """The comparison as a GitHub pull-request comment, within its 65,536 characters
    (:func:`gpudoctor.render.markdown.fit_comment`)."""
    found = finding_rows(d)
    return fit_comment(lambda limit: _diff_markdown(d, found, limit), lambda: _diff_markdown(d, [], 0, minimal=True))


def _diff_markdown(d: Diff, found: list[dict[str, Any]], limit: int | None, minimal: bool = False) -> str:
    def rows(items: list[dict[str, str]], first: str) -> list[list[str]]:
        return [[md_text(r[first]), r["before"], r["after"], r["delta"]] for r in items]

    parts = [
        "### gpudoctor diff: " + md_text(clip(summary_line(d) or "no change measured")),
        f"Before: {md_code(clip(d['before']['command'] or '(unknown)'))}  \n"
        f"After: {md_code(clip(d['after']['command'] or '(unknown)'))}",
        table(["", "before", "after", "change"], rows(overview_rows(d), "label"), right={1, 2, 3}),
        md_text(noise_text(d)),
        "#### Where the time went (seconds per step; startup per launch)\n\n"
        + table(
            ["slice", "before", "after", "change"],
            rows(breakdown_rows(d), "label"),
            right={1, 2, 3},
        ),
    ]
    if minimal:
        parts.append("*The findings and notes are too long for a pull-request comment: run "
                     "gpudoctor diff BEFORE AFTER -o diff.html to read them.*")
        return "\n\n".join(parts) + "\n"
    shown = found if limit is None else found[:limit]
    listed = _findings_markdown(shown, md_code, md_text)
    if len(shown) < len(found):
        listed += "\n\n" + left_out(len(found) - len(shown), "findings", "gpudoctor diff -o diff.html")
    if len(found) > FINDINGS_SHOWN:
        listed = details(f"{len(found):,} findings: resolved, new and still present", listed)
    parts.append("#### Findings\n\n" + listed)
    applied = [r for r in shown if r["predicted"]]
    if applied:
        parts.append(
            "#### Predicted vs achieved\n\n"
            + table(
                ["finding", "status", "predicted", "achieved", "achieved from"],
                [[" → ".join(md_code(x, in_table=True) for x in r["rules"]), md_text(r["status"]),
                  r["predicted"], r["achieved"], md_text(r["basis"])] for r in applied],
                right={2, 3},
            )
        )
    notes = diff_notes(d)
    if notes:
        kept = notes if limit is None else notes[:limit]
        text = "\n".join("- " + md_text(n) for n in kept)
        if len(kept) < len(notes):
            text += "\n\n" + left_out(len(notes) - len(kept), "notes", "gpudoctor diff -o diff.json")
        parts.append(text if len(notes) <= NOTES_SHOWN else details(f"{len(notes):,} notes", text))
    return "\n\n".join(parts) + "\n"


MARKS = {"resolved": "✅", "partial": "◐", "moved": "↪️", "gone": "❔", "new": "🆕", "still_present": "⏳"}


def _findings_markdown(found: list[dict[str, Any]], md_code: Any, md_text: Any) -> str:
    lines = []
    for r in found:
        rules = " → ".join(md_code(x) for x in r["rules"])
        waste = (f"waste {r['waste_after']}" if r["key"] == "new"
                 else f"waste {r['waste_before']} → {r['waste_after']}")
        sev = f" ({md_text(r['severity'])})" if r["key"] == "new" else ""
        lines.append(
            f"- {MARKS[r['key']]} {md_text(r['status'])} {rules}{sev}: {md_text(r['title'])}; "
            f"{md_text(waste)}; {md_text(r['bucket'])}"
        )
    return "\n".join(lines) or "No findings in either run."


def render_diff_html(d: Diff) -> str:
    """The comparison as one self-contained, escaped HTML page."""
    found = finding_rows(d)
    view = {
        "d": worded(d),
        "overview": overview_rows(d),
        "noise": noise_text(d),
        "breakdown": breakdown_rows(d),
        "findings": found,
        "applied": [r for r in found if r["predicted"]],
        "bar_before": markup(charts.breakdown_bar_svg(d["before"]["breakdown"], height=26)),
        "bar_after": markup(charts.breakdown_bar_svg(d["after"]["breakdown"], height=26)),
        "severity_colors": SEVERITY_COLORS,
    }
    return render_template("diff.html.j2", view)
