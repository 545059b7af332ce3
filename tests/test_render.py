"""Renderers: what a user reading report.html / report.md / report.json relies on."""

from __future__ import annotations

import copy
import json
import math
import re
from html import escape, unescape
from pathlib import Path

import numpy
import pytest

from gpudoctor.common.errors import UserError
from gpudoctor.render import renderer_for, write_all
from gpudoctor.render.base import fmt_usd
from gpudoctor.render.diff_page import render_diff_html
from gpudoctor.render.html import HtmlRenderer
from gpudoctor.render.json_renderer import JsonRenderer
from gpudoctor.render.markdown import MarkdownRenderer, md_code, md_text
from gpudoctor.render.terminal import summary_lines
from gpudoctor.report.diff import diff_reports

DATA = Path(__file__).parent / "data"
HOSTILE = "<script>alert(1)</script>"


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture
def sample() -> dict:
    """A data-stalled single-H100 run with padding, checkpoints, the built-in price and profiler
    windows; built by build_report (tests/report_fixtures.py)."""
    return load("report_sample")


@pytest.fixture
def nogpu() -> dict:
    """A crashed two-rank CPU run: no GPU, no price, a null GPU busy share."""
    return load("report_nogpu")


@pytest.fixture
def hostile(sample: dict) -> dict:
    """The sample with run strings an attacker (or an odd file name) could control."""
    r = copy.deepcopy(sample)
    r["run"]["command"] = ["python", f"{HOSTILE}.py", "--name", "a|b`c`"]
    r["run"]["host"]["hostname"] = HOSTILE
    r["run"]["gpus"][0]["name"] = HOSTILE
    r["verdict"] = f"verdict {HOSTILE}"
    f = r["findings"][0]
    f["title"] = HOSTILE
    f["evidence"] = f"loader reads /data/{HOSTILE}.jsonl | slow [x](http://evil) **bold**"
    f["data"]["file"] = HOSTILE
    f["fix"]["summary"] = HOSTILE
    f["fix"]["config"] = {"dataloader_num_workers": HOSTILE}
    f["fix"]["snippet"] = f"open('{HOSTILE}')\n```\n{HOSTILE}"
    r["notes"] = [f"skipped 2 lines in {HOSTILE}"]
    r["per_rank"] = [dict(r["per_rank"][0], pid=HOSTILE), dict(r["per_rank"][0], rank=1)]
    return r


def pct_text(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


# --- choosing a renderer -----------------------------------------------------


@pytest.mark.parametrize(
    ("target", "cls"),
    [
        ("out/report.html", HtmlRenderer),
        (".md", MarkdownRenderer),
        ("json", JsonRenderer),
        ("X.HTML", HtmlRenderer),
    ],
)
def test_renderer_chosen_by_extension(target: str, cls: type) -> None:
    assert isinstance(renderer_for(target), cls)


@pytest.mark.parametrize("target", ["report.pdf", "report", "out/report.txt"])
def test_unknown_extension_is_a_user_error_naming_the_supported_ones(target: str) -> None:
    with pytest.raises(UserError) as err:
        renderer_for(target)
    message = str(err.value)
    assert "\n" not in message
    assert all(ext in message for ext in (".html", ".md", ".json"))


def test_write_all_writes_the_three_files(sample: dict, tmp_path: Path) -> None:
    written = write_all(sample, tmp_path / "run")
    assert sorted(p.name for p in written) == ["report.html", "report.json", "report.md"]
    assert json.loads((tmp_path / "run" / "report.json").read_text()) == sample


# --- JSON --------------------------------------------------------------------


def test_json_turns_nan_and_inf_into_null_and_keeps_finding_order(sample: dict) -> None:
    sample["shares"]["cpu_busy"] = math.nan
    sample["cost"]["wasted_usd_per_hour"] = math.inf
    sample["findings"].reverse()
    text = JsonRenderer().render(sample)
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)
    assert back["shares"]["cpu_busy"] is None and back["cost"]["wasted_usd_per_hour"] is None
    assert [f["rule"] for f in back["findings"]] == [f["rule"] for f in sample["findings"]]


def test_json_round_trips_and_turns_what_json_cannot_hold_into_null(sample: dict) -> None:
    """report.json is strict JSON that loads back to the same report; NaN, infinities and
    numpy-like scalars (what a sampler may hand over) become null or plain numbers."""
    text = JsonRenderer().render(sample)
    assert json.loads(text) == sample
    odd = copy.deepcopy(sample)
    odd["breakdown"]["compute"] = float("nan")
    odd["steps"]["count"] = numpy.int64(7)  # what a numpy-based sampler hands over
    odd["cost"]["usd_per_hour"] = float("inf")
    back = json.loads(JsonRenderer().render(odd))  # strict: json.loads accepts no NaN here
    assert back["breakdown"]["compute"] is None and back["cost"]["usd_per_hour"] is None
    assert back["steps"]["count"] == 7 and type(back["steps"]["count"]) is int
    assert list(back) == list(sample)  # key order kept: diffs of report.json stay readable


# --- HTML --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["report_sample", "report_nogpu"])
def test_html_shows_every_breakdown_slice_with_its_percentage(name: str) -> None:
    report = load(name)
    html = HtmlRenderer().render(report)
    for key, frac in report["breakdown"].items():
        label = key.replace("_", " ")
        assert re.search(
            rf"{label}</td>\s*<td class=\"num[^\"]*\">{re.escape(pct_text(frac))}<", html
        ), key


def visible(html: str) -> str:
    """The page's text as a reader sees it (no style, no tags, entities unescaped)."""
    text = re.sub(r"<style>.*?</style>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", text)).split())


def test_html_null_share_reads_unavailable_not_zero(sample: dict) -> None:
    sample["shares"]["gpu_busy"] = None  # a GPU whose busy share could not be read
    sample["shares"]["tokenization"] = None
    html = HtmlRenderer().render(sample)
    assert re.search(r"<td>GPU busy, of wall time</td><td class=\"num unavailable\">unavailable</td>", html)
    assert re.search(r"<td>tokenization, of wall time</td><td class=\"num unavailable\">unavailable</td>", html)


def test_html_cpu_run_without_price_says_each_missing_thing_once(nogpu: dict) -> None:
    """No price: said once (the note), no dollar tiles, no Cost card. No GPU: 'no GPU on this
    machine' once, and no empty GPU panel, tile or share."""
    html = HtmlRenderer().render(nogpu)
    text = visible(html)
    assert text.count("--price-per-gpu-hour") == 1 and "no price" not in text.replace("no price given", "")
    assert not re.search(r"\$\d", text) and "wasted $/hour" not in text and "<h2>Cost</h2>" not in html
    assert text.count("no GPU on this machine") == 1
    assert "GPU busy" not in text and "no GPU busy samples" not in html


def test_html_cpu_is_of_all_cores_in_tiles_card_and_chart(sample: dict) -> None:
    """One convention: the share and the timeline are both % of all N cores; the series'
    100 = one core is divided by the cores, so the chart's scale stays 0-100%."""
    n = sample["run"]["host"]["cpu_count"]
    ticks = len(sample["timeline"]["series"]["t_s"])
    # half the cores, and a tick of sampler jitter above all of them (still 100% at most)
    sample["timeline"]["series"]["cpu_pct"] = [100.0 * n / 2] * (ticks - 1) + [110.0 * n]
    html = HtmlRenderer().render(sample)
    text = visible(html)
    assert f"CPU busy, of all {n} cores" in text
    assert f"{100 * sample['shares']['cpu_busy']:.1f}% of all {n} cores" in text
    assert f"CPU % of all {n} cores" in html
    chart = html[html.index(f"CPU % of all {n} cores"):]
    assert ">100%<" in chart and ">50%<" in chart and ">200%<" not in chart  # a 0-100% axis


def test_html_info_findings_are_notes_not_problems(nogpu: dict) -> None:
    info = [f for f in nogpu["findings"] if f["severity"] == "info"]
    problems = [f for f in nogpu["findings"] if f["severity"] != "info"]
    assert info and len(problems) == 1
    html = HtmlRenderer().render(nogpu)
    cards = re.findall(r'<section class="card finding".*?</section>', html, re.S)
    assert len(cards) == len(problems) and all(f["rule"] not in "".join(cards) for f in info)
    assert "Findings: 1 problem<" in html
    notes = html[html.index("<h2>Notes</h2>"):]
    for f in info:
        assert escape(f["title"]) in notes and escape(f["fix"]["summary"]) in notes
    assert "Fix:" not in notes and "waste <b>" not in notes and "badge" not in notes


def test_html_start_time_is_human_with_its_zone(sample: dict) -> None:
    sample["run"]["started_at"] = "2026-11-24T01:55:38.664560+00:00"
    html = HtmlRenderer().render(sample)
    assert "2026-11-24 01:55:38 UTC" in html and "01:55:38.664560" not in html
    assert json.loads(JsonRenderer().render(sample))["run"]["started_at"] == "2026-11-24T01:55:38.664560+00:00"


def test_html_says_the_command_crashed_and_what_the_report_covers(sample: dict) -> None:
    sample["run"].update(status="crashed", exit_code=137)
    text = visible(HtmlRenderer().render(sample))
    assert "exit code 137 (signal 9, SIGKILL)" in text
    assert "The command crashed with exit code 137 (signal 9, SIGKILL); the report covers the 5m 00s it ran." in text


def test_html_shows_findings_in_given_order_with_fix_and_dollars(sample: dict) -> None:
    html = HtmlRenderer().render(sample)
    positions = [html.index(f">{f['rule']}</code>") for f in sample["findings"]]
    assert positions == sorted(positions)
    top = sample["findings"][0]
    assert f"{fmt_usd(top['waste_usd_per_hour'])}</b>/hour" in html
    assert f"{top['predicted_speedup']:.2f}×" in html
    assert "dataloader_num_workers" in html and "save_only_model" in html
    assert f"<pre><code>{escape(top['fix']['snippet'])}</code></pre>" in html


def test_html_escapes_every_run_string(hostile: dict) -> None:
    html = HtmlRenderer().render(hostile)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("&lt;script&gt;") >= 10


def test_html_shows_inline_code_as_code_and_a_forged_backtick_stays_escaped(sample: dict) -> None:
    report = copy.deepcopy(sample)
    top = report["findings"][0]
    top["fix"]["summary"] = "Run with `--num-workers 1` instead of `<script>x</script>`; `unclosed"
    html = HtmlRenderer().render(report)
    assert "Run with <code>--num-workers 1</code> instead of <code>&lt;script&gt;x&lt;/script&gt;</code>" in html
    assert "; `unclosed" in html  # a lone backtick is text
    assert "<script>x" not in html


def test_html_is_self_contained(sample: dict) -> None:
    html = HtmlRenderer().render(sample)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "@import" not in html and "url(" not in html
    assert "<svg" in html and "<polyline" in html


def test_html_stays_small_for_an_hour_long_run(sample: dict) -> None:
    """One-second samples and a step every 0.25 s for an hour still make a small page."""
    n = 3600 * 4
    tl = sample["timeline"]
    tl["duration_s"] = sample["run"]["duration_s"] = 3600.0
    tl["series"] = {
        "t_s": [i * 0.25 for i in range(n)],
        "gpu_busy_pct": [50 + 40 * math.sin(i / 50) for i in range(n)],
        "cpu_pct": [100.0] * n,
        "rss_mib": [4000.0] * n,
    }
    tl["steps_t_s"] = [i * 0.25 for i in range(n)]
    tl["spans"]["data_wait"] = [[i * 0.25, i * 0.25 + 0.1] for i in range(n)]
    html = HtmlRenderer().render(sample)
    assert len(html.encode()) < 300_000
    points = max(len(m.split()) for m in re.findall(r'<polyline points="([^"]*)"', html))
    assert points <= 2000


@pytest.mark.parametrize("duration_s", [90.0, 3 * 3600.0, 14 * 86400.0, 9.17e10])
def test_the_timeline_axis_has_at_most_ten_labels_whatever_the_length(sample: dict, duration_s: float) -> None:
    """Ticks past 8 hours used to stay 8 hours apart: a two-week attach drew 42 labels on top of each
    other, and a start no calendar holds (2,900 years) drew 3 million and took 14 s to render."""
    sample["timeline"]["duration_s"] = sample["run"]["duration_s"] = duration_s
    html = HtmlRenderer().render(sample)
    svg = html[html.index('<svg class="chart"'):]
    svg = svg[:svg.index("</svg>")]
    labels = re.findall(r'<text[^>]*text-anchor="middle"[^>]*font-size="10"[^>]*>([^<]*)</text>', svg)
    assert 2 <= len(labels) <= 11, labels[:20]
    assert labels[0] == "0"


def test_html_per_rank_table_only_with_several_ranks(sample: dict, nogpu: dict) -> None:
    assert "Per rank" not in HtmlRenderer().render(sample)
    html = HtmlRenderer().render(nogpu)
    assert "Per rank" in html and f"<td class=\"num\">{nogpu['per_rank'][1]['pid']}</td>" in html


def test_html_renders_a_minimal_report() -> None:
    """A partial recording with most keys missing still renders, saying what is missing."""
    html = HtmlRenderer().render(
        {"schema": "gpudoctor.report/1", "run": {"command": ["python", "t.py"]}}
    )
    assert "No timeline was recorded" in html and "unavailable" in html


# --- Markdown ----------------------------------------------------------------


def strip_code(md: str) -> str:
    """Markdown with fenced blocks and code spans removed (GitHub shows them literally)."""
    out, fence = [], None
    for line in md.splitlines():
        m = re.match(r"^(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            out.append(re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", line))
    return "\n".join(out)


def test_markdown_has_verdict_breakdown_and_findings_tables(sample: dict) -> None:
    md = MarkdownRenderer().render(sample)
    assert md.splitlines()[0] == "### gpudoctor: " + md_text(sample["verdict"])
    for key, frac in sample["breakdown"].items():
        assert f"| {key.replace('_', ' ')} | {pct_text(frac)} |" in md
    top = sample["findings"][0]
    assert top["rule"] == "data_stall" and top["severity"] == "high"
    assert (f"| 1 | `data_stall` | 🔴 high | {pct_text(top['waste_fraction'])} | "
            f"{fmt_usd(top['waste_usd_per_hour'])} | {top['predicted_speedup']:.2f}× |") in md
    workers = top["fix"]["config"]["dataloader_num_workers"]
    assert (f"```python\n# {top['fix']['library']}\nTrainingArguments(\n    ...,\n"
            f"    dataloader_num_workers={workers},") in md
    assert f"**{fmt_usd(sample['cost']['wasted_usd_per_hour'])}/hour**" in md


def test_markdown_null_share_reads_unavailable(sample: dict) -> None:
    sample["shares"]["gpu_busy"] = None
    assert "GPU busy unavailable of wall time" in MarkdownRenderer().render(sample)


def test_markdown_cpu_run_without_price_says_each_missing_thing_once(nogpu: dict) -> None:
    """The same as the HTML: one price line (the note), one 'no GPU on this machine', no $ column,
    info findings as notes (not in the findings table, no 'Fix:'), CPU of all N cores, the crash."""
    md = MarkdownRenderer().render(nogpu)
    assert md.count("--price-per-gpu-hour") == 1 and "no price:" not in md and "| $/hour |" not in md
    assert md.count("no GPU on this machine") == 1 and "GPU busy" not in md
    assert f"CPU busy {100 * nogpu['shares']['cpu_busy']:.1f}% of all 8 cores" in md
    table_part = md[md.index("### Findings"):md.index("### Notes")]
    assert "### Findings: 1 problem\n" in md and "cost\\_unavailable" not in table_part
    assert "cost_unavailable" not in table_part and "⚪" not in md
    notes = md[md.index("### Notes"):]
    assert "- Dollar figures unavailable: " in notes and "Fix:" not in notes
    assert "**The command crashed with exit code 1; the report covers the 2m 00s it ran.**" in md
    assert "| rank | pid |" in md


def test_markdown_start_time_is_human(sample: dict) -> None:
    sample["run"]["started_at"] = "2026-11-24T01:55:38.664560+00:00"
    md = MarkdownRenderer().render(sample)
    assert "started 2026-11-24 01:55:38 UTC" in md and ".664560" not in md


def test_markdown_escapes_run_strings_outside_code(hostile: dict) -> None:
    md = MarkdownRenderer().render(hostile)
    prose = strip_code(md)
    assert "<script" not in prose.lower()
    assert "&lt;script&gt;" in prose
    assert "[x](http://evil)" not in prose and "**bold**" not in prose
    # every row keeps its table's column count: pipes in run strings are escaped
    for table in re.findall(r"(?:^\| .*\n)+", md, re.M):
        counts = {len(re.findall(r"(?<!\\)\|", row)) for row in table.splitlines()}
        assert len(counts) == 1, table


def test_markdown_code_cannot_be_closed_by_its_content(hostile: dict) -> None:
    md = MarkdownRenderer().render(hostile)
    assert (
        "````python\nopen('<script>alert(1)</script>')\n```\n<script>alert(1)</script>\n````" in md
    )
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"


# --- terminal ----------------------------------------------------------------


def test_terminal_says_the_crash_the_cores_and_no_gpu_once(nogpu: dict) -> None:
    lines = summary_lines(nogpu, Path("r"))
    text = "\n".join(lines)
    assert lines[0] == "gpudoctor: the command crashed with exit code 1; the report covers the 2m 00s it ran."
    assert lines[1].startswith("gpudoctor: Crashed (exit code 1) after 200 training steps") and "1 problem found;" in lines[1]
    assert text.count("no GPU on this machine") == 1 and "GPU busy" not in text
    assert f"CPU busy {100 * nogpu['shares']['cpu_busy']:.1f}% of all 8 cores" in text
    assert "cost_unavailable" not in text and "price" not in text  # notes are for the report


def test_terminal_of_a_finished_gpu_run_has_no_outcome_line(sample: dict) -> None:
    lines = summary_lines(sample, Path("r"))
    assert lines[0].startswith("gpudoctor: 5 problems found;")
    assert any(ln.startswith("  GPU busy 45%; CPU busy") and "of all 16 cores" in ln for ln in lines)
    assert sum(ln.startswith("  [") for ln in lines) == 5


def test_diff_page_shows_start_times_as_people_read_them(sample: dict, nogpu: dict) -> None:
    sample["run"]["started_at"] = "2026-11-24T01:55:38.664560+00:00"
    html = render_diff_html(diff_reports(sample, nogpu))
    assert "2026-11-24 01:55:38 UTC" in html and ".664560" not in html


def test_a_stated_price_on_a_cpu_run_never_shows_a_gpu_it_did_not_see(tmp_path: Path) -> None:
    """``report --price-per-gpu-hour 2.5`` on a CPU run: the header said "1 GPU · $2.50/GPU-hour"
    while every other line said there was no GPU (issue #38)."""
    from gpudoctor.recording.store import load_recording
    from gpudoctor.report.build import ReportOptions, build_report
    from tests.recording_builder import RecordingBuilder

    b = RecordingBuilder(tmp_path, cores=2, duration_s=20.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.05, wait_s=0.04, fetch_s=0.04)
    b.host_rows(cpu_total_pct=50.0, cpu_proc_pct=100.0)
    b.write()
    report = build_report(load_recording(tmp_path), ReportOptions(price_per_gpu_hour=2.5))
    assert report["run"]["gpus"] == [] and report["run"]["gpu_count"] == 1
    header = MarkdownRenderer().render(report).split("\n\n")[1]
    assert "no GPU on this machine (priced as 1 GPU)" in header and "· 1 GPU ·" not in header
    html = HtmlRenderer().render(report)
    assert "no GPU on this machine (priced as 1 GPU)" in html


def test_a_fixs_code_spans_stay_code_in_markdown(sample: dict) -> None:
    """report.md showed `Run with \\`--padding longest\\`` in a pull-request comment: the fix's own
    code spans are code; the text between them stays escaped, a span's content stays literal."""
    from markdown_it import MarkdownIt

    r = copy.deepcopy(sample)
    r["findings"][0]["fix"]["summary"] = "Run with `--padding longest` instead of *its* default (`max_length`)."
    r["findings"][0]["evidence"] = f"flag `{HOSTILE}` and `a``b` seen"
    md = MarkdownRenderer().render(r)
    assert "**Fix:** Run with `--padding longest` instead of \\*its\\* default (`max_length`)." in md
    html = MarkdownIt("commonmark").render(md)
    assert "<code>--padding longest</code>" in html and "<em>" not in html.split("--padding longest")[1][:80]
    assert "<script>" not in html and "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>" in html
