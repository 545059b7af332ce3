"""report.md and the diff Markdown fit a pull-request comment, for a 64-rank run and beyond.

GitHub refuses a comment over 65,536 characters. A 64-rank run has a per-rank table and, when
a hook failed on every rank, a note and an info finding per rank; the renderers fold those
into <details> and, past the limit, list fewer rows and say how many are left out.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.render.diff_page import render_diff_markdown
from gpudoctor.render.markdown import COMMENT_LIMIT, MarkdownRenderer, md_text
from gpudoctor.report.build import build_report
from gpudoctor.report.diff import diff_reports
from tests.conftest import cli
from tests.recording_builder import T0, RecordingBuilder
from tests.report_fixtures import TRAINER_ARGS

RANKS = 64


def _write_64_ranks(root: Path, wait_s: float, seed: int) -> Path:
    """A 64-rank Trainer run on 8 H100s where a hook failed on every rank (a note per rank)."""
    b = RecordingBuilder(root, cores=64, duration_s=300.0)
    for rank in range(RANKS):
        rows = b.process(pid=1000 + rank, rank=rank)
        end = b.training_loop(rows, start_s=20.0, steps=150, compute_s=0.5 + 0.002 * rank, wait_s=wait_s,
                              fetch_s=0.2, save_every=50, save_s=4.0, trainer_args=TRAINER_ARGS, jitter_s=0.02,
                              seed=seed + rank)
        b.tokenizer_counters(rows, start_s=20.0, end_s=end, total_s=20.0)
        rows.append({"k": "hook_error", "t": T0 + 30.0 + rank, "where": "torch_hooks.batch_padding",
                     "vital": False, "error": "ValueError", "message": f"rank {rank}: unexpected batch <layout> | x"})
    b.host_rows(cpu_total_pct=50.0, cpu_proc_pct=3000.0)
    b.gpu_rows(util_pct=45.0, mem_used_mib=52000.0, count=8)
    return b.write()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("ranks64")
    return _write_64_ranks(tmp / "before", 0.2, 0), _write_64_ranks(tmp / "after", 0.05, 1000)


@pytest.fixture(scope="module")
def reports(runs: tuple[Path, Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    return build_report(load_recording(runs[0])), build_report(load_recording(runs[1]))


def _outside_details(md: str) -> str:
    return re.sub(r"<details>.*?</details>", "", md, flags=re.S)


def _balanced(md: str) -> bool:
    return md.count("<details>") == md.count("</details>") and md.count("<summary>") == md.count("</summary>")


def test_64_rank_report_md_from_the_cli_fits_a_comment_with_every_rank_folded(runs, tmp_path) -> None:
    out = tmp_path / "report.md"
    proc = cli("report", str(runs[0]), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert len(md) <= COMMENT_LIMIT and _balanced(md)
    assert len(re.findall(r"^\| \d+ \| 1\d{3} \|", md, re.M)) == RANKS  # every rank's row, pid 1000-1063
    shown = _outside_details(md)
    assert shown.startswith("### gpudoctor: ")
    assert "| data wait |" in shown and "| # | rule |" in shown  # breakdown and findings tables stay open
    assert "| rank | pid |" not in shown and f"{RANKS} ranks: breakdown and step times" in md
    assert re.search(r"<summary>\d+ notes</summary>", md) and "was switched off in pid" not in shown  # folded


def test_64_rank_diff_md_from_the_cli_fits_a_comment(runs, tmp_path) -> None:
    out = tmp_path / "diff.md"
    proc = cli("diff", str(runs[0]), str(runs[1]), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert len(md) <= COMMENT_LIMIT and _balanced(md)
    assert md.startswith("### gpudoctor diff: ") and "| data wait |" in md


def test_a_report_far_past_the_limit_lists_the_slowest_ranks_and_counts_the_rest(reports) -> None:
    big = copy.deepcopy(reports[0])
    big["per_rank"] = [dict(r, rank=i, pid=10_000 + i) for i in range(2_000) for r in big["per_rank"][:1]]
    big["per_rank"][1234] = copy.deepcopy(big["per_rank"][1234])
    big["per_rank"][1234]["steps"]["step_time_s"]["p50"] = 9.0  # the straggler
    big["notes"] = [f"note {i}: " + "a long explanation of a partial recording " * 10 for i in range(3_000)]
    md = MarkdownRenderer().render(big)
    assert len(md) <= COMMENT_LIMIT and _balanced(md)
    assert "| 1234 | 11234 |" in md  # the slowest rank is among those kept
    assert re.search(r"\*[\d,]+ more ranks \(the faster ones\) left out to fit a pull-request comment", md)
    assert re.search(r"\*[\d,]+ more notes left out", md)
    assert md.startswith("### gpudoctor: " + md_text(big["verdict"]))


def test_forged_giant_strings_still_give_a_comment_with_the_headline_and_breakdown(reports) -> None:
    forged = copy.deepcopy(reports[0])
    forged["verdict"] = "<b>" * 50_000
    forged["run"]["command"] = ["python", "x" * 200_000]
    for f in forged["findings"]:
        f["evidence"] = "e" * 70_000
    md = MarkdownRenderer().render(forged)
    assert len(md) <= COMMENT_LIMIT and "<b>" not in md
    assert "| data wait |" in md
    before, after = copy.deepcopy(reports[0]), copy.deepcopy(reports[1])
    after["notes"] = ["n" * 1_000] * 500
    after["run"]["command"] = ["y" * 100_000]
    d = render_diff_markdown(diff_reports(before, after))
    assert len(d) <= COMMENT_LIMIT and _balanced(d) and "| data wait |" in d
