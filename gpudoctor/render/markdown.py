"""``report.md``: the report as a GitHub pull-request comment.

A comment holds at most :data:`COMMENT_LIMIT` characters, so long sections fold into
``<details>`` (the per-rank table past :data:`RANKS_SHOWN` ranks, the evidence and fixes past
:data:`DETAILS_SHOWN` findings, notes past :data:`NOTES_SHOWN`) and, when a report is still too
long (thousands of ranks, a forged report.json), :func:`fit_comment` renders fewer rows of
those sections, saying how many are left out, down to the headline and breakdown alone.

Strings from the run never become live Markdown or HTML: prose is escaped
(``<`` as ``&lt;``, Markdown punctuation with backslashes, ``|`` in tables),
code goes in code spans and fences whose backtick runs are longer than any in
the text, so a hostile command or snippet cannot close them early. Inside code
GitHub shows ``<script>`` literally.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpudoctor.core.schema import (
    BREAKDOWN_KEYS,
    SECTIONS,
    Cost,
    Finding,
    Padding,
    RankEntry,
    Report,
    Run,
)
from gpudoctor.render import sections
from gpudoctor.render.base import (
    NO_PRICE,
    Renderer,
    breakdown_items,
    command_text,
    config_code,
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
    gpu_clock_rows,
    gpus_text,
    has_gpu,
    num,
    outcome_text,
    plural,
    startup_text,
)
from gpudoctor.render.charts import SPAN_LABELS

SEVERITY_MARKS = {"high": "🔴", "medium": "🟠", "low": "🟡", "info": "⚪"}
COMMENT_LIMIT = 65_536  # GitHub's most characters in an issue or pull-request comment
RANKS_SHOWN = 8  # more ranks fold their table into <details>
DETAILS_SHOWN = 3  # findings whose evidence and fix show unfolded; the rest fold
NOTES_SHOWN = 5
INLINE_CHARS = 1_000  # the verdict and the command are cut here (a real one is far shorter)
LIMITS = (None, 64, 16, 4, 0)  # rows per long section, tried in turn until the comment fits
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_LINE_START = re.compile(r"^(\s*)([-+]|\d{1,9}(?=[.)](?:\s|$)))")


def md_text(text: Any) -> str:
    """Run text as inert Markdown prose on one line (safe in tables too)."""
    s = " ".join(str(text).split())
    s = "".join(_HTML.get(c, c) for c in s)
    s = re.sub(r"([\\`*\[\]|~!#])", r"\\\1", s)
    s = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", s)
    return _LINE_START.sub(_escape_marker, s)


def _escape_marker(m: re.Match[str]) -> str:
    """Keep a leading ``-``/``+``/``1.`` from starting a list or a rule."""
    indent, marker = m.group(1), m.group(2)
    return indent + marker + "\\" if marker[0].isdigit() else indent + "\\" + marker


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def md_prose(text: Any) -> str:
    """Prose whose `code` spans stay code: the fixes quote flags and values so (`--padding longest`).
    Between the spans the text is escaped as :func:`md_text`; each span's content goes through
    :func:`md_code`, whose fence no backtick inside can close, so nothing in it becomes markup."""
    s = " ".join(str(text).split())
    out: list[str] = []
    last = 0
    for m in _CODE_SPAN.finditer(s):
        out.append(_md_between(s[last:m.start()]))
        out.append(md_code(m.group(1)))
        last = m.end()
    out.append(_md_between(s[last:]))
    return "".join(out)


def _md_between(part: str) -> str:
    """:func:`md_text` of a piece between code spans, keeping the spaces at its ends."""
    if not part.strip():
        return part
    lead = " " if part[0] == " " else ""
    tail = " " if part[-1] == " " else ""
    return lead + md_text(part) + tail


def md_code(text: Any, in_table: bool = False) -> str:
    """Run text as one inline code span that no backtick inside can close."""
    s = " ".join(str(text).split())
    if in_table:
        s = s.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(code: str, lang: str = "") -> str:
    """A fenced code block longer than any backtick run in ``code``."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{code.rstrip()}\n{fence}"


def snippet_lang(snippet: str) -> str:
    """``bash`` for command lines, ``python`` for everything else."""
    first = next((ln.strip() for ln in snippet.splitlines() if ln.strip()), "")
    shell = ("pip ", "python ", "python3 ", "torchrun ", "accelerate ", "export ", "gpudoctor ")
    return "bash" if first.startswith(shell) or re.match(r"^[A-Z_]+=\S+ ", first) else "python"


def details(summary: str, body: str) -> str:
    """``body`` folded under ``summary`` (already escaped); the blank lines let GitHub render
    the Markdown inside."""
    return f"<details>\n<summary>{summary}</summary>\n\n{body.strip()}\n\n</details>"


def clip(text: Any, limit: int = INLINE_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (before escaping)."""
    s = str(text)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def left_out(count: int, what: str, where: str) -> str:
    """The line that says a section shows fewer rows than the report holds."""
    return f"*{count:,} more {what} left out to fit a pull-request comment: see {where}.*"


def fit_comment(render: Callable[[int | None], str], minimal: Callable[[], str]) -> str:
    """``render(limit)`` with the first limit of :data:`LIMITS` that fits :data:`COMMENT_LIMIT`
    (``limit``: rows per long section, None for all), else ``minimal()``, cut if it must be."""
    for limit in LIMITS:
        text = render(limit)
        if len(text) <= COMMENT_LIMIT:
            return text
    text = minimal()
    if len(text) <= COMMENT_LIMIT:
        return text
    cut = text[: COMMENT_LIMIT - 200].rsplit("\n", 1)[0]
    return cut + "\n\n*(cut to fit a pull-request comment)*\n"


def table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A GitHub table; cells must already be escaped."""
    right = right or set()
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = [header, align] + rows
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


class MarkdownRenderer(Renderer):
    """Renders ``report.md``."""

    output_file_extension = "md"

    def render(self, report: Report) -> str:
        return fit_comment(lambda limit: render_report(report, limit), lambda: minimal_report(report))


def render_report(report: Report, limit: int | None = None) -> str:
    """The whole report, with at most ``limit`` rows in each long section (None: all)."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    parts = [
        headline(report),
        outcome_line(report.get("run") or {}),
        run_line(report.get("run") or {}, noted=_price_noted(findings)),
        cost_line(report.get("cost") or {}, noted=_price_noted(findings)),
        "### Where the time went\n\n" + breakdown_table(report),
        facts_lines(report),
        findings_section([f for f in findings if f.get("severity") != "info"], limit),
        ranks_section(report.get("per_rank"), limit),
        *(section_parts(report) if limit is None or limit > 0 else []),
        notes_section(info_notes(findings, report.get("notes")), limit),
        footer(report),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def minimal_report(report: Report) -> str:
    """Headline, run, cost and the seven slices: what a comment shows when nothing else fits."""
    noted = _price_noted([f for f in report.get("findings") or [] if isinstance(f, dict)])
    parts = [headline(report), outcome_line(report.get("run") or {}), run_line(report.get("run") or {}, noted),
             cost_line(report.get("cost") or {}, noted),
             "### Where the time went\n\n" + breakdown_table(report, known_only=True),
             "*The findings, per-rank figures and notes are too long for a pull-request comment: "
             "see report.html or report.json.*", footer(report)]
    return "\n\n".join(p for p in parts if p) + "\n"


def headline(report: Report) -> str:
    """The one-line verdict as the comment's heading."""
    return "### gpudoctor: " + md_text(clip(report.get("verdict") or "no verdict"))


def outcome_line(run: Run) -> str:
    """The command crashed or was interrupted, and the report covers what ran; "" when it finished."""
    text = outcome_text(run)
    return f"**{md_text(text[:1].upper() + text[1:])}.**" if text else ""


def _price_noted(findings: list[Finding]) -> bool:
    """A ``cost_unavailable`` note says why there are no dollars: the rest need not say it again."""
    return any(f.get("rule") == "cost_unavailable" for f in findings)


def run_line(run: Run, noted: bool = False) -> str:
    """Command, status, start, duration, GPUs and price on one line (a missing price only when no
    note says it)."""
    status = str(run.get("status") or "finished")
    if run.get("exit_code") not in (None, 0):
        status += f", {exit_text(run.get('exit_code'))}"
    price = num(run.get("price_per_gpu_hour_usd"))
    bits = [
        md_code(clip(command_text(run.get("command"))) or "(no command recorded)"),
        md_text(status),
        md_text("started " + fmt_time(run.get("started_at"))) if run.get("started_at") else "",
        fmt_duration(run.get("duration_s")),
        md_text(gpus_text(run)),
        f"{fmt_usd(price)}/GPU-hour" if price is not None else "" if noted else md_text(NO_PRICE),
    ]
    return " · ".join(b for b in bits if b)


def cost_line(cost: Cost, noted: bool = False) -> str:
    """Wasted share and dollars, and the whole-run projection when known."""
    line = f"**Wasted:** {fmt_pct(cost.get('wasted_fraction'))} of wall time"
    if num(cost.get("wasted_usd_per_hour")) is None:
        return line if noted else line + " · " + md_text(NO_PRICE)
    line += f" · **{fmt_usd(cost.get('wasted_usd_per_hour'))}/hour**"
    line += f" of {fmt_usd(cost.get('usd_per_hour'))}/hour"
    if num(cost.get("wasted_usd_so_far")) is not None:
        line += f" · {fmt_usd(cost.get('wasted_usd_so_far'))} so far"
    if num(cost.get("projected_wasted_usd")) is not None:
        line += f" · {fmt_usd(cost.get('projected_wasted_usd'))} over the projected whole run"
        if num(cost.get("projected_run_usd")) is not None:
            line += f" ({fmt_usd(cost.get('projected_run_usd'))} total)"
    return line


def breakdown_table(report: Report, known_only: bool = False) -> str:
    """Slice, share of wall time, seconds; ``known_only``: the seven slices, no extra ones."""
    duration = num((report.get("run") or {}).get("duration_s"))
    rows = []
    for key, frac in breakdown_items(report.get("breakdown")):
        if known_only and key not in BREAKDOWN_KEYS:
            continue
        seconds = fmt_duration(frac * duration) if frac is not None and duration else ""
        rows.append([md_text(SPAN_LABELS.get(key, key)), fmt_pct(frac), seconds])
    return table(["slice", "share", "time"], rows, right={1, 2})


def facts_lines(report: Report) -> str:
    """Shares, padding and steps, one line each."""
    run = report.get("run") or {}
    shares = report.get("shares") or {}
    padding = report.get("padding") or {}
    steps = report.get("steps") or {}
    times = steps.get("step_time_s") or {}
    gpu = f"GPU busy {fmt_pct(shares.get('gpu_busy'))} of wall time · " if has_gpu(run) else ""
    return "\n".join(
        [
            f"**Shares:** tokenization {fmt_pct(shares.get('tokenization'))} of wall time · {gpu}"
            f"CPU busy {cpu_text(shares.get('cpu_busy'), run)} (the training processes)  ",
            padding_line(padding) + "  ",
            f"**Steps:** {fmt_int(steps.get('count') or 0)} · p50 {fmt_step_time(times.get('p50'))} · "
            f"p90 {fmt_step_time(times.get('p90'))} · first step at {fmt_duration(steps.get('first_step_at_s'))}  ",
            "**Startup:** " + startup_text(report.get("startup")) + "  ",
            "**GPU clock:** " + " · ".join(f"{md_text(k)} {md_text(v)}" for k, v in gpu_clock_rows(report)),
        ]
    )


def padding_line(padding: Padding) -> str:
    """Pad share and the lengths behind it, or why it is unavailable."""
    batches = fmt_int(padding.get("batches_seen") or 0)
    if num(padding.get("pad_fraction")) is None:
        return f"**Padding:** unavailable ({batches} padded batches seen)"
    return (
        f"**Padding:** {fmt_pct(padding.get('pad_fraction'))} pad tokens "
        f"(max length {fmt_int(padding.get('max_length'))}, p50 {fmt_int(padding.get('p50_length'))}, "
        f"p99 {fmt_int(padding.get('p99_length'))}; {batches} batches)"
    )


def findings_section(findings: list[Finding], limit: int | None = None) -> str:
    """The findings table, then each finding's evidence and fix (past :data:`DETAILS_SHOWN`,
    folded); at most ``limit`` of each, the rest counted."""
    if not findings:
        return "### Findings\n\nNo problems found: nothing in this run points to wasted time."
    priced = any(num(f.get("waste_usd_per_hour")) is not None for f in findings)
    shown = findings if limit is None else findings[: max(limit, 1)]
    rows = [
        [
            str(i),
            md_code(f.get("rule") or "unknown", in_table=True),
            SEVERITY_MARKS.get(str(f.get("severity")), "")
            + " "
            + md_text(f.get("severity") or "info"),
            "a risk" if f.get("risk") else fmt_pct(f.get("waste_fraction")),
            *([fmt_usd(f.get("waste_usd_per_hour"), "unavailable")] if priced else []),
            fmt_finding_speedup(f),
        ]
        for i, f in enumerate(shown, 1)
    ]
    header = ["#", "rule", "severity", "waste", *(["$/hour"] if priced else []), "steady speedup"]
    parts = [table(header, rows, right=set(range(3, len(header))))]
    if len(shown) < len(findings):
        parts.append(left_out(len(findings) - len(shown), "findings", "report.json"))
    explained = shown if limit is None else shown[:limit]
    texts = [finding_detail(i, f) for i, f in enumerate(explained, 1)]
    parts += texts[:DETAILS_SHOWN]
    if texts[DETAILS_SHOWN:]:
        first, last = DETAILS_SHOWN + 1, len(texts)
        parts.append(details(f"Evidence and fixes of findings {first}–{last}" if last > first
                             else f"Evidence and fix of finding {first}", "\n\n".join(texts[DETAILS_SHOWN:])))
    if len(explained) < len(findings):
        parts.append(left_out(len(findings) - len(explained), "findings' evidence and fixes", "report.html"))
    return f"### Findings: {plural(len(findings), 'problem')}\n\n" + "\n\n".join(parts)


def finding_detail(index: int, finding: Finding) -> str:
    """Title, evidence, fix summary, config block and snippet of one finding."""
    fix = finding.get("fix") or {}
    title = finding.get("title") or finding.get("rule") or "finding"
    out = [
        f"#### {index}. {md_text(title)} ({md_code(finding.get('rule') or 'unknown')})",
        md_prose(finding.get("evidence") or ""),
    ]
    if fix.get("summary"):
        out.append("**Fix:** " + md_prose(fix["summary"]))
    if fix_memory_text(fix):
        out.append(md_prose(fix_memory_text(fix)))
    for t in fix_tables(fix):
        lang, code = config_code(t["config"], t.get("library"), t.get("call"))
        out.append(md_fence(code, lang))
    snippet = fix.get("snippet")
    if snippet:
        out.append(md_fence(str(snippet), snippet_lang(str(snippet))))
    return "\n\n".join(p for p in out if p)


def ranks_section(per_rank: list[RankEntry] | None, limit: int | None = None) -> str:
    """Per-rank breakdown, only for more than one rank; folded past :data:`RANKS_SHOWN` ranks.
    With ``limit``, only the ``limit`` slowest ranks (by p50 step time): the stragglers."""
    if not per_rank or len(per_rank) < 2:
        return ""
    shown = per_rank if limit is None or len(per_rank) <= limit else _slowest(per_rank, limit)
    keys = [k for k, _ in breakdown_items(per_rank[0].get("breakdown"))]
    header = ["rank", "pid"] + [md_text(SPAN_LABELS.get(k, k)) for k in keys] + ["steps", "p50 step"]
    rows = []
    for rank in shown:
        bd = dict(breakdown_items(rank.get("breakdown")))
        steps = rank.get("steps") or {}
        rows.append(
            [md_text(rank.get("rank", "")), md_text(rank.get("pid", ""))]
            + [fmt_pct(bd.get(k)) for k in keys]
            + [
                fmt_int(steps.get("count") or 0),
                fmt_step_time((steps.get("step_time_s") or {}).get("p50")),
            ]
        )
    body = table(header, rows, right=set(range(2, len(header)))) if rows else ""
    if len(shown) < len(per_rank):
        body += "\n\n" + left_out(len(per_rank) - len(shown), "ranks (the faster ones)", "report.json")
    if len(per_rank) <= RANKS_SHOWN:
        return "### Per rank\n\n" + body
    return "### Per rank\n\n" + details(f"{len(per_rank):,} ranks: breakdown and step times", body)


def _slowest(per_rank: list[RankEntry], limit: int) -> list[RankEntry]:
    """The ``limit`` ranks with the longest p50 step, in rank order (unknown step times last)."""
    def p50(r: RankEntry) -> float:
        return num(((r.get("steps") or {}).get("step_time_s") or {}).get("p50")) or -1.0

    keep = {id(r) for r in sorted(per_rank, key=p50, reverse=True)[:limit]}
    return [r for r in per_rank if id(r) in keep]


def section_parts(report: Report) -> list[str]:
    """Each registered optional section (:mod:`gpudoctor.render.sections`), in report order;
    every string from the report made inert Markdown before it is formatted."""
    views = sections.views(_inert({s.key: report.get(s.key) for s in SECTIONS} | {
        "breakdown": report.get("breakdown"), "per_rank": report.get("per_rank")}))
    return [SECTION_MARKDOWN[key](view) for key, view in views.items() if view is not None]


def saves_section(v: dict[str, Any]) -> str:
    return "**Saves:** " + " · ".join(f"{label} {count} ({time})" for label, count, time in v["rows"])


def profiler_section(v: dict[str, Any]) -> str:
    rows = [list(r) for r in v["rows"]]
    header = ["rank", "at", "window", "steps", "DataLoader wait", "GPU kernels busy"]
    parts = ["### torch.profiler cross-check", v["summary"], table(header, rows, right={1, 2, 3, 4, 5}),
             v["more"]]
    return "\n\n".join(p for p in parts if p)


def check_section(v: dict[str, Any]) -> str:
    """A replay on a GPU: the prediction for it beside what was measured."""
    lines = ["### Prediction checked on this GPU", "", v["title"], ""]
    if v["rows"]:
        lines += ["| | predicted | measured | measured/predicted |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in v["rows"]]
        lines.append("")
    lines += [f"- note: {note}" for note in v["notes"]]
    return "\n".join(lines).rstrip()


def preflight_section(v: dict[str, Any]) -> str:
    """The full run predicted on ``--target``, before and after the fixes."""
    lines = ["### Prediction for the full run", "", v["title"], "", "| | before | after fixes |", "|---|---|---|"]
    lines += [f"| {label} | {b} | {a} |" for label, b, a in v["rows"]]
    lines.append("")
    lines += [f"- fix ({fx})" for fx in v["fixes"]]
    lines += [f"- note: {note}" for note in v["notes"]]
    return "\n".join(lines).rstrip()


def trial_section(v: dict[str, Any]) -> str:
    """``gpudoctor try``: the fix tried on the command itself, predicted vs achieved steps/s."""
    parts = [f"### Fix tried: {v['title']}",
             f"Predicted {v['predicted']}, achieved {v['achieved']}" + (f" ({v['basis']})." if v["basis"] else ".")]
    if v["rows"]:
        parts.append(table(["", "baseline", "with the fix"], [list(r) for r in v["rows"]], right={1, 2}))
    parts += ["\n".join(f"- applied: {line}" for line in v["applied"]),
              "\n".join(f"- not applied: {line}" for line in v["not_applied"]),
              "\n".join(f"- {n}" for n in v["notes"])]
    return "\n\n".join(p for p in parts if p)


def nodes_section(v: dict[str, Any]) -> str:
    """A merged multi-node job: its nodes side by side, the slowest ranks, the clock skew corrected."""
    parts = ["### Nodes", v["skew"], table(v["header"], [list(r) for r in v["rows"]], right={3, 4, 5, 6, 7, 8}),
             v["more"], f"**{v['rank_caption']}**",
             table(v["rank_header"], [list(r) for r in v["rank_rows"]], right={2, 3, 4, 5, 6, 7, 8})]
    return "\n\n".join(p for p in parts if p)


SECTION_MARKDOWN = {
    "saves": saves_section,
    "profiler": profiler_section,
    "prediction_check": check_section,
    "preflight": preflight_section,
    "trial": trial_section,
    "nodes": nodes_section,
}


def _inert(value: Any) -> Any:
    """Every string inside ``value`` as inert Markdown (:func:`md_text`), keys too: a view prints
    the keys of open objects (a trial's ``applied[].values``, the script's flags). The schema's own
    keys are identifiers that :func:`md_text` leaves as they are, so the views still find them."""
    if isinstance(value, str):
        return md_text(value)
    if isinstance(value, dict):
        return {_inert(k): _inert(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_inert(v) for v in value]
    return value


def info_notes(findings: list[Finding], notes: Any) -> list[str]:
    """The report's own notes (attach's lines lead them), then the info findings: notes, not
    problems (no waste, no "Fix:"), as "title: what was seen. What it means"; each said once."""
    infos = [f for f in findings if f.get("severity") == "info"]
    said = {str(f.get("evidence")) for f in infos}
    out = [str(n) for n in notes or [] if str(n) not in said]
    for f in infos:
        seen = str(f.get("evidence") or "").strip()
        seen += "" if not seen or seen[-1] in ".!?" else "."
        out.append(f"{f.get('title') or f.get('rule')}: {seen} {(f.get('fix') or {}).get('summary') or ''}".strip())
    return out


def notes_section(notes: list[Any] | None, limit: int | None = None) -> str:
    """Partial recordings, skipped lines and the like; folded past :data:`NOTES_SHOWN`."""
    if not notes:
        return ""
    shown = notes if limit is None else notes[:limit]
    body = "\n".join("- " + md_text(n) for n in shown)
    if len(shown) < len(notes):
        body += "\n\n" + left_out(len(notes) - len(shown), "notes", "report.json")
    if len(notes) <= NOTES_SHOWN:
        return "### Notes\n\n" + body
    return "### Notes\n\n" + details(f"{len(notes):,} notes", body)


def footer(report: Report) -> str:
    """Which gpudoctor wrote it."""
    version = (report.get("run") or {}).get("gpudoctor_version") or ""
    return f"<sub>gpudoctor {md_text(version)} · {md_text(report.get('schema') or '')}</sub>"
