"""Before/after comparison of two reports, for a pull request.

:func:`diff_reports` is a pure function of two report dicts; the renderers
turn its result into Markdown (a PR comment) or one self-contained HTML page.
A figure missing on either side gives a null delta, never a made-up one.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.render.base import (
    SEVERITY_COLORS,
    SLICE_COLORS,
    breakdown_items,
    command_text,
    fmt_duration,
    fmt_pct,
    fmt_step_time,
    fmt_usd,
    gpus_text,
    num,
)
from gpudoctor.render.charts import SPAN_LABELS

DIFF_SCHEMA = "gpudoctor.diff/1"


def change(before: Any, after: Any) -> dict[str, float | None]:
    """``{"before", "after", "delta"}`` with ``delta = after - before`` when both are known."""
    b, a = num(before), num(after)
    return {"before": b, "after": a, "delta": None if a is None or b is None else a - b}


def _p50(report: dict[str, Any]) -> float | None:
    return num(((report.get("steps") or {}).get("step_time_s") or {}).get("p50"))


def throughput(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """Steps per second (1 / p50 step time) and the after/before ratio."""
    b, a = _p50(before), _p50(after)
    out = change(1 / b if b else None, 1 / a if a else None)
    out["ratio"] = b / a if a and b else None
    return out


def _by_rule(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The largest-waste finding of each rule (a rule may fire once per rank)."""
    rules: dict[str, dict[str, Any]] = {}
    for finding in report.get("findings") or []:
        rule = str(finding.get("rule") or "unknown")
        seen = rules.get(rule)
        if seen is None or (num(finding.get("waste_fraction")) or 0) > (
            num(seen.get("waste_fraction")) or 0
        ):
            rules[rule] = finding
    return rules


def _finding_summary(finding: dict[str, Any]) -> dict[str, Any]:
    return {
        "rule": str(finding.get("rule") or "unknown"),
        "title": str(finding.get("title") or finding.get("rule") or ""),
        "severity": str(finding.get("severity") or "info"),
        "waste_fraction": num(finding.get("waste_fraction")),
        "waste_usd_per_hour": num(finding.get("waste_usd_per_hour")),
    }


def diff_findings(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Findings by rule: ``resolved`` (only before), ``new`` (only after), ``still_present``."""
    b, a = _by_rule(before), _by_rule(after)
    still = []
    for rule in (r for r in a if r in b):
        entry = {
            "rule": rule,
            "title": _finding_summary(a[rule])["title"],
            "severity_before": str(b[rule].get("severity") or "info"),
            "severity_after": str(a[rule].get("severity") or "info"),
            "waste_fraction": change(b[rule].get("waste_fraction"), a[rule].get("waste_fraction")),
            "waste_usd_per_hour": change(
                b[rule].get("waste_usd_per_hour"), a[rule].get("waste_usd_per_hour")
            ),
        }
        still.append(entry)
    return {
        "resolved": [_finding_summary(b[r]) for r in b if r not in a],
        "new": [_finding_summary(a[r]) for r in a if r not in b],
        "still_present": still,
    }


def _side(report: dict[str, Any]) -> dict[str, Any]:
    run = report.get("run") or {}
    return {
        "command": command_text(run.get("command")),
        "started_at": run.get("started_at"),
        "status": run.get("status"),
        "gpus": gpus_text(run),
        "verdict": report.get("verdict"),
        "breakdown": dict(breakdown_items(report.get("breakdown"))),
    }


def diff_reports(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Everything that changed between two runs, as plain numbers and rule names."""
    b_run, a_run = before.get("run") or {}, after.get("run") or {}
    b_cost, a_cost = before.get("cost") or {}, after.get("cost") or {}
    b_bd, a_bd = (
        dict(breakdown_items(before.get("breakdown"))),
        dict(breakdown_items(after.get("breakdown"))),
    )
    d = {
        "schema": DIFF_SCHEMA,
        "before": _side(before),
        "after": _side(after),
        "duration_s": change(b_run.get("duration_s"), a_run.get("duration_s")),
        "step_time_p50_s": change(_p50(before), _p50(after)),
        "throughput_steps_per_s": throughput(before, after),
        "breakdown": {k: change(b_bd.get(k), a_bd.get(k)) for k in dict.fromkeys([*b_bd, *a_bd])},
        "wasted_fraction": change(b_cost.get("wasted_fraction"), a_cost.get("wasted_fraction")),
        "wasted_usd_per_hour": change(
            b_cost.get("wasted_usd_per_hour"), a_cost.get("wasted_usd_per_hour")
        ),
        "findings": diff_findings(before, after),
        "notes": comparability_notes(before, after),
    }
    d["summary"] = summary_line(d)
    return d


def comparability_notes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Warnings that make the comparison less than like for like."""
    notes = []
    b_gpus, a_gpus = gpus_text(before.get("run") or {}), gpus_text(after.get("run") or {})
    if b_gpus != a_gpus:
        notes.append(f"The runs used different hardware: {b_gpus} before, {a_gpus} after.")
    for label, report in (("before", before), ("after", after)):
        status = (report.get("run") or {}).get("status")
        if status not in (None, "finished"):
            notes.append(f"The {label} run is {status}; its figures cover only what was recorded.")
    return notes


def summary_line(d: dict[str, Any]) -> str:
    """One line: speed change, resolved/new rules, wasted $/hour change."""
    parts = []
    ratio = d["throughput_steps_per_s"].get("ratio")
    if ratio:
        parts.append(
            f"steps {ratio:.2f}× as fast" if ratio >= 1 else f"steps {1 / ratio:.2f}× slower"
        )
    found = d["findings"]
    if found["resolved"]:
        parts.append("resolved " + ", ".join(f["rule"] for f in found["resolved"]))
    if found["new"]:
        parts.append("new " + ", ".join(f["rule"] for f in found["new"]))
    usd = d["wasted_usd_per_hour"]
    if usd["before"] is not None and usd["after"] is not None:
        parts.append(f"wasted {fmt_usd(usd['before'])}/h → {fmt_usd(usd['after'])}/h")
    else:
        wf = d["wasted_fraction"]
        parts.append(f"wasted {fmt_pct(wf['before'])} → {fmt_pct(wf['after'])} of wall time")
    return "; ".join(parts)


# ---- rendering -------------------------------------------------------------


def fmt_delta(value: float | None, kind: str) -> str:
    """A signed change: percentage points, seconds, dollars or steps/s."""
    if value is None:
        return "unavailable"
    sign = "+" if value > 0 else "−" if value < 0 else "±"
    v = abs(value)
    if kind == "pct":
        return f"{sign}{v * 100:.1f} pp"
    if kind == "usd":
        return sign + fmt_usd(v)
    if kind == "step":
        return sign + fmt_step_time(v)
    if kind == "duration":
        return sign + fmt_duration(v)
    return f"{sign}{v:.2f}"


def _better(value: float | None, lower_is_better: bool) -> str:
    """CSS class for a change: green when it helps, red when it hurts."""
    if not value:
        return ""
    return "delta-good" if (value < 0) == lower_is_better else "delta-bad"


def overview_rows(d: dict[str, Any]) -> list[dict[str, str]]:
    """Headline metrics: label, before, after, change, and whether it helps."""
    spec = [
        ("duration", d["duration_s"], fmt_duration, "duration", None),
        ("step time p50", d["step_time_p50_s"], fmt_step_time, "step", True),
        ("throughput (steps/s)", d["throughput_steps_per_s"], _rate, "num", False),
        ("wasted fraction", d["wasted_fraction"], fmt_pct, "pct", True),
        ("wasted $/hour", d["wasted_usd_per_hour"], lambda v: fmt_usd(v, "no price"), "usd", True),
    ]
    rows = []
    for label, c, fmt, kind, lower in spec:
        rows.append(
            {
                "label": label,
                "before": fmt(c["before"]),
                "after": fmt(c["after"]),
                "delta": fmt_delta(c["delta"], kind),
                "class": "" if lower is None else _better(c["delta"], lower),
            }
        )
    ratio = d["throughput_steps_per_s"].get("ratio")
    if ratio:
        rows[2]["delta"] += f" ({ratio:.2f}×)"
    return rows


def _rate(value: float | None) -> str:
    return "unavailable" if value is None else f"{value:.2f}"


def breakdown_rows(d: dict[str, Any]) -> list[dict[str, str]]:
    """Each slice before/after/change; a smaller share is better except compute."""
    rows = []
    for key, c in d["breakdown"].items():
        rows.append(
            {
                "key": key,
                "label": SPAN_LABELS.get(key, key),
                "color": SLICE_COLORS.get(key, "#777777"),
                "before": fmt_pct(c["before"]),
                "after": fmt_pct(c["after"]),
                "delta": fmt_delta(c["delta"], "pct"),
                "class": _better(c["delta"], key != "compute"),
            }
        )
    return rows


def render_diff_markdown(d: dict[str, Any]) -> str:
    """The comparison as a GitHub pull-request comment."""
    from gpudoctor.render.markdown import md_code, md_text, table

    def rows(items: list[dict[str, str]], first: str) -> list[list[str]]:
        return [[md_text(r[first]), r["before"], r["after"], r["delta"]] for r in items]

    parts = [
        "### gpudoctor diff: " + md_text(d.get("summary") or "no change measured"),
        f"Before: {md_code(d['before']['command'] or '(unknown)')}  \nAfter: {md_code(d['after']['command'] or '(unknown)')}",
        table(["", "before", "after", "change"], rows(overview_rows(d), "label"), right={1, 2, 3}),
        "#### Where the time went\n\n"
        + table(
            ["slice", "before", "after", "change"],
            rows(breakdown_rows(d), "label"),
            right={1, 2, 3},
        ),
        "#### Findings\n\n" + _findings_markdown(d["findings"], md_code, md_text),
    ]
    if d.get("notes"):
        parts.append("\n".join("- " + md_text(n) for n in d["notes"]))
    return "\n\n".join(parts) + "\n"


def _findings_markdown(found: dict[str, list[dict[str, Any]]], md_code: Any, md_text: Any) -> str:
    lines = []
    for f in found["resolved"]:
        lines.append(
            f"- ✅ resolved {md_code(f['rule'])}: {md_text(f['title'])} (was {fmt_pct(f['waste_fraction'])})"
        )
    for f in found["new"]:
        lines.append(
            f"- 🆕 new {md_code(f['rule'])} ({md_text(f['severity'])}): {md_text(f['title'])} ({fmt_pct(f['waste_fraction'])})"
        )
    for f in found["still_present"]:
        w = f["waste_fraction"]
        lines.append(
            f"- ⏳ still present {md_code(f['rule'])}: waste {fmt_pct(w['before'])} → {fmt_pct(w['after'])}"
            f" ({fmt_delta(w['delta'], 'pct')})"
        )
    return "\n".join(lines) or "No findings in either run."


def render_diff_html(d: dict[str, Any]) -> str:
    """The comparison as one self-contained, escaped HTML page."""
    from gpudoctor.render import charts
    from gpudoctor.render.html import markup, render_template

    view = {
        "d": d,
        "overview": overview_rows(d),
        "breakdown": breakdown_rows(d),
        "bar_before": markup(charts.breakdown_bar_svg(d["before"]["breakdown"], height=26)),
        "bar_after": markup(charts.breakdown_bar_svg(d["after"]["breakdown"], height=26)),
        "severity_colors": SEVERITY_COLORS,
        "fmt_pct": fmt_pct,
        "fmt_delta": fmt_delta,
    }
    return render_template("diff.html.j2", view)
