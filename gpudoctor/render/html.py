"""``report.html``: one self-contained page (inline CSS and SVG, no scripts).

The report is first turned into a flat view of display strings
(:func:`build_view`), so the template only loops and prints. Jinja2 autoescape
is on: every string from the run is escaped; only the SVG charts, built and
escaped in :mod:`gpudoctor.render.charts`, are inserted as markup.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.core.schema import (
    Breakdown,
    Cost,
    Finding,
    Padding,
    RankEntry,
    Report,
    Run,
    Shares,
    Steps,
    Timeline,
)
from gpudoctor.render import charts, sections
from gpudoctor.render.base import (
    NO_PRICE,
    SEVERITY_COLORS,
    SLICE_COLORS,
    Renderer,
    breakdown_items,
    command_text,
    config_code,
    cores,
    cpu_text,
    exit_text,
    fix_memory_text,
    fix_tables,
    fmt_duration,
    fmt_finding_speedup,
    fmt_int,
    fmt_pct,
    fmt_step_time,
    fmt_time,
    fmt_usd,
    fmt_value,
    gpu_clock_rows,
    gpus_text,
    has_gpu,
    host_text,
    num,
    outcome_text,
    plural,
    startup_text,
)

if TYPE_CHECKING:
    import jinja2

TEMPLATES = Path(__file__).parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja2 environment (imported lazily; autoescape always on)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["human_time"] = fmt_time  # an ISO start time as "2026-11-24 01:55:38 UTC"
    env.filters["code_spans"] = code_spans
    return env


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def code_spans(text: Any) -> Any:
    """A finding's text with its `inline code` (the Markdown form every renderer shares) as <code>.

    The whole string is escaped first, so a backtick in the run's own strings can only
    ever produce a ``<code>`` element around already-escaped text, never markup.
    """
    from markupsafe import Markup, escape  # Jinja2's own dependency, imported with it (lazily)

    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", str(escape(str(text)))))


def markup(svg: str) -> Any:
    """Mark chart SVG (already escaped) as safe for the template."""
    from markupsafe import Markup

    return Markup(svg)


def render_template(name: str, view: dict[str, Any]) -> str:
    """Render ``templates/<name>`` with ``view``."""
    return environment().get_template(name).render(**view)


class HtmlRenderer(Renderer):
    """Renders ``report.html``."""

    output_file_extension = "html"

    def render(self, report: Report) -> str:
        return render_template("report.html.j2", build_view(report))


def build_view(report: Report) -> dict[str, Any]:
    """Everything the template prints, as display strings."""
    run = report.get("run") or {}
    cost = report.get("cost") or {}
    duration_s = num(run.get("duration_s"))
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    problems = [finding_view(f) for f in findings if f.get("severity") != "info"]
    return {
        "header": header_view(run, cost, any(f.get("rule") == "cost_unavailable" for f in findings)),
        "verdict": str(report.get("verdict") or "no verdict"),
        "verdict_color": verdict_color(findings),
        "kpis": kpi_view(report),
        "timeline_svg": markup(charts.timeline_svg(report.get("timeline"), duration_s, cores(run), has_gpu(run))),
        "timeline_legend": timeline_legend(report.get("timeline"), run),
        "timeline_caption": str((report.get("timeline") or {}).get("caption") or "Seconds since launch."),
        "breakdown_svg": markup(charts.breakdown_bar_svg(report.get("breakdown"))),
        "breakdown_rows": breakdown_rows(report.get("breakdown"), duration_s),
        "shares": shares_view(report.get("shares"), run),
        "padding": padding_view(report.get("padding")),
        "gpu_clock": gpu_clock_rows(report),
        "steps": steps_view(report.get("steps")) + [("startup", startup_text(report.get("startup")))],
        "findings": problems,
        "findings_heading": "Findings: " + plural(len(problems), "problem"),
        "cost": cost_view(cost) if num(cost.get("usd_per_hour")) is not None else [],
        "ranks": ranks_view(report.get("per_rank")),
        **sections.views(report),  # saves, profiler, prediction_check, preflight, trial
        "notes": notes_view(findings, report.get("notes")),
        "schema": str(report.get("schema") or ""),
    }


def header_view(run: Run, cost: Cost, noted: bool = False) -> dict[str, Any]:
    """Command, status and the facts about where it ran. A missing price is said once: by the
    ``cost_unavailable`` note when there is one (``noted``), else here."""
    exit_code = run.get("exit_code")
    status = str(run.get("status") or ("finished" if exit_code in (0, None) else "crashed"))
    price = num(run.get("price_per_gpu_hour_usd"))
    gpu_count = run.get("gpu_count") or 0
    source = cost.get("price_source")
    price_text = ("" if noted else NO_PRICE) if price is None else (f"{fmt_usd(price)} per GPU-hour × {plural(gpu_count, 'GPU')}"
                                           + (f" (source: {source})" if source else ""))
    return {
        "command": command_text(run.get("command")) or "(no command recorded)",
        "status": status,
        "status_class": status
        if status in ("finished", "crashed", "interrupted", "partial")
        else "other",
        "exit_code": "" if exit_code is None else exit_text(exit_code),
        "outcome": outcome_text(run),
        "facts": [
            ("mode", str(run.get("mode") or "unknown")),
            ("started", fmt_time(run.get("started_at"))),
            ("duration", fmt_duration(run.get("duration_s"))),
            ("pid", "" if run.get("pid") is None else str(run.get("pid"))),
            ("host", host_text(run.get("host")) or "unknown"),
            ("GPUs", gpus_text(run)),
            ("price", price_text),
        ],
        "version": str(run.get("gpudoctor_version") or ""),
    }


def verdict_color(findings: list[Finding]) -> str:
    """The colour of the most severe finding; calm blue-grey when nothing is wrong."""
    severities = {str(f.get("severity")) for f in findings}
    worst = next((s for s in ("high", "medium", "low") if s in severities), "info")
    return SEVERITY_COLORS[worst]


def kpi_view(report: Report) -> list[tuple[str, str]]:
    """The few headline figures under the verdict: dollars only with a price, GPU busy only
    with a GPU (what is missing is said once, in the header and the notes, not in every tile)."""
    run = report.get("run") or {}
    cost = report.get("cost") or {}
    steps = report.get("steps") or {}
    shares = report.get("shares") or {}
    kpis = [("wasted time", fmt_pct(cost.get("wasted_fraction")))]
    if num(cost.get("usd_per_hour")) is not None:
        kpis += [("wasted $/hour", fmt_usd(cost.get("wasted_usd_per_hour"), "unavailable")),
                 ("wasted so far", fmt_usd(cost.get("wasted_usd_so_far"), "unavailable"))]
    if has_gpu(run):
        kpis.append(("GPU busy", fmt_pct(shares.get("gpu_busy"))))
    n = cores(run)
    kpis.append((f"CPU busy, of all {n} cores" if n else "CPU busy", fmt_pct(shares.get("cpu_busy"))))
    kpis.append(("step time p50", fmt_step_time((steps.get("step_time_s") or {}).get("p50"))))
    return kpis


def timeline_legend(timeline: Timeline | None, run: Run) -> list[tuple[str, str]]:
    """``(label, colour)`` for the lanes and lines the timeline draws."""
    spans = (timeline or {}).get("spans") or {}
    kinds = charts.lane_kinds(spans)
    legend = [(charts.SPAN_LABELS.get(k, k), SLICE_COLORS.get(k, "#777777")) for k in kinds]
    if has_gpu(run):
        legend.append(("GPU busy %", SLICE_COLORS["compute"]))
    return legend + [(charts.cpu_label(cores(run)), "#3d4852")]


def breakdown_rows(
    breakdown: Breakdown | None, duration_s: float | None
) -> list[dict[str, str]]:
    """Legend rows: colour, slice, share of wall time, seconds."""
    rows = []
    for key, frac in breakdown_items(breakdown):
        seconds = None if frac is None or duration_s is None else frac * duration_s
        rows.append(
            {
                "label": charts.SPAN_LABELS.get(key, key),
                "color": SLICE_COLORS.get(key, "#777777"),
                "pct": fmt_pct(frac),
                "time": fmt_duration(seconds) if seconds is not None else "",
            }
        )
    return rows


def shares_view(shares: Shares | None, run: Run) -> list[tuple[str, str]]:
    """Tokenization (of wall time), GPU busy (only with a GPU), CPU busy (of all cores)."""
    shares = shares or {}
    rows = [("tokenization, of wall time", fmt_pct(shares.get("tokenization")))]
    if has_gpu(run):
        rows.append(("GPU busy, of wall time", fmt_pct(shares.get("gpu_busy"))))
    rows.append(("CPU busy, training processes", cpu_text(shares.get("cpu_busy"), run)))
    return rows


def padding_view(padding: Padding | None) -> list[tuple[str, str]]:
    """Pad fraction and the sequence lengths behind it."""
    padding = padding or {}
    return [
        ("pad tokens", fmt_pct(padding.get("pad_fraction"))),
        ("max length", fmt_int(padding.get("max_length"))),
        ("p50 length", fmt_int(padding.get("p50_length"))),
        ("p99 length", fmt_int(padding.get("p99_length"))),
        ("batches seen", fmt_int(padding.get("batches_seen") or 0)),
    ]


def steps_view(steps: Steps | None) -> list[tuple[str, str]]:
    """Step count, step-time percentiles and when training began."""
    steps = steps or {}
    times = steps.get("step_time_s") or {}
    p50 = num(times.get("p50"))
    return [
        ("steps", fmt_int(steps.get("count") or 0)),
        ("step time p50", fmt_step_time(p50)),
        ("step time p90", fmt_step_time(times.get("p90"))),
        ("steps / second", f"{1 / p50:.2f}" if p50 else "unavailable"),
        ("first step at", fmt_duration(steps.get("first_step_at_s"))),
    ]


def finding_view(finding: Finding) -> dict[str, Any]:
    """One finding card."""
    fix = finding.get("fix") or {}
    severity = str(finding.get("severity") or "info")
    return {
        "rule": str(finding.get("rule") or "unknown"),
        "title": str(finding.get("title") or finding.get("rule") or "finding"),
        "severity": severity,
        "color": SEVERITY_COLORS.get(severity, SEVERITY_COLORS["info"]),
        "waste": "none: a risk, not a waste" if finding.get("risk") else fmt_pct(finding.get("waste_fraction")),
        "usd": fmt_usd(finding.get("waste_usd_per_hour")),
        "has_usd": num(finding.get("waste_usd_per_hour")) is not None,
        "speedup": fmt_finding_speedup(finding),
        "evidence": str(finding.get("evidence") or ""),
        "data": [(str(k), fmt_value(v)) for k, v in (finding.get("data") or {}).items()],
        "fix_summary": str(fix.get("summary") or ""),
        "fix_memory": fix_memory_text(fix),
        "tables": [
            {"library": str(t.get("library") or ""),
             "code": config_code(t["config"], t.get("library"), t.get("call"))[1]}
            for t in fix_tables(fix)
        ],
        "snippet": str(fix.get("snippet") or ""),
    }


def cost_view(cost: Cost) -> list[tuple[str, str]]:
    """Price of the run, waste, and the whole-run projection when known."""
    rows = [
        ("run cost per hour", fmt_usd(cost.get("usd_per_hour"))),
        ("wasted per hour", fmt_usd(cost.get("wasted_usd_per_hour"))),
        ("wasted fraction", fmt_pct(cost.get("wasted_fraction"))),
        ("wasted so far", fmt_usd(cost.get("wasted_usd_so_far"))),
    ]
    hours = num(cost.get("projected_run_hours"))
    if hours is not None:
        rows.append(("projected run length", fmt_duration(hours * 3600)))
    if num(cost.get("projected_run_usd")) is not None:
        rows.append(("projected run cost", fmt_usd(cost.get("projected_run_usd"))))
    if num(cost.get("projected_wasted_usd")) is not None:
        rows.append(("projected waste", fmt_usd(cost.get("projected_wasted_usd"))))
    return rows


def sentence(text: Any) -> str:
    """``text`` ending in a full stop, so a note's "what it means" reads as the next sentence."""
    s = str(text or "").strip()
    return s if not s or s[-1] in ".!?" else s + "."


def notes_view(findings: list[Finding], notes: Any) -> list[dict[str, str]]:
    """The report's plain notes (attach's lines lead them), then the info findings: notes, not
    problems, each a title, what was seen and what it means, with no waste, dollars or "Fix:".
    A plain note an info finding already says is said once."""
    infos = [f for f in findings if f.get("severity") == "info"]
    said = {str(f.get("evidence")) for f in infos}
    return [{"title": "", "text": str(n), "means": ""} for n in notes or [] if str(n) not in said] + [
        {"title": str(f.get("title") or f.get("rule") or "note"), "text": sentence(f.get("evidence")),
         "means": str((f.get("fix") or {}).get("summary") or "")} for f in infos]


def ranks_view(per_rank: list[RankEntry] | None) -> dict[str, Any] | None:
    """A per-rank table, only when there is more than one rank."""
    if not per_rank or len(per_rank) < 2:
        return None
    keys = [k for k, _ in breakdown_items(per_rank[0].get("breakdown"))]
    header = ["rank", "pid"] + [charts.SPAN_LABELS.get(k, k) for k in keys] + ["steps", "p50 step"]
    rows = []
    for rank in per_rank:
        bd = dict(breakdown_items(rank.get("breakdown")))
        steps = rank.get("steps") or {}
        rows.append(
            [str(rank.get("rank", "")), str(rank.get("pid", ""))]
            + [fmt_pct(bd.get(k)) for k in keys]
            + [
                fmt_int(steps.get("count") or 0),
                fmt_step_time((steps.get("step_time_s") or {}).get("p50")),
            ]
        )
    return {"header": header, "rows": rows}
