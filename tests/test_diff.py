"""Before/after diff: what a reviewer reading the PR comment relies on."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gpudoctor.render.diff_page import render_diff_html, render_diff_markdown
from gpudoctor.render.diff_words import notes as diff_notes
from gpudoctor.report.diff import diff_reports

DATA = Path(__file__).parent / "data"
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def before() -> dict:
    """A hand-written report from before findings carried claims (diff must still read one)."""
    return json.loads((DATA / "report_before_claims.json").read_text())


@pytest.fixture
def after(before: dict) -> dict:
    """The same job after the data fixes: workers on, tokenization moved out, a new rule."""
    r = copy.deepcopy(before)
    r["run"]["duration_s"] = 1200.0
    r["breakdown"] = {
        "startup": 0.05,
        "data_wait": 0.04,
        "compute": 0.83,
        "checkpoint": 0.05,
        "eval": 0.0,
        "other": 0.03,
    }
    r["steps"]["step_time_s"] = {"p50": 0.51, "p90": 0.6}
    keep = {"padding_waste", "checkpoint_overhead"}
    r["findings"] = [f for f in r["findings"] if f["rule"] in keep]
    r["findings"][0]["waste_fraction"] = 0.2
    r["findings"].append(
        {
            "rule": "cpu_saturated",
            "severity": "medium",
            "title": "CPU saturated",
            "waste_fraction": 0.06,
            "waste_usd_per_hour": 0.15,
            "evidence": "4 workers use all 16 cores.",
            "fix": {
                "summary": "Use 3 workers.",
                "config": {"dataloader_num_workers": 3},
                "snippet": None,
            },
            "predicted_speedup": 1.02,
        }
    )
    r["cost"].update(wasted_usd_per_hour=0.6, wasted_fraction=0.24)
    return r


def test_findings_are_classified_by_their_seconds(before: dict, after: dict) -> None:
    found = diff_reports(before, after)["findings"]
    # data wait fell 0.50 -> 0.03 s/step and startup 149 -> 60 s/launch: beyond the noise
    assert [f["rule"] for f in found["resolved"]] == [
        "data_stall",
        "tokenization_in_loop",
        "startup_idle",
    ]
    assert [f["rule"] for f in found["new"]] == ["cpu_saturated"]
    assert found["moved"] == [] and found["gone"] == [] and found["partial"] == []
    still = {f["rule"]: f for f in found["still_present"]}
    assert set(still) == {"padding_waste", "checkpoint_overhead"}
    assert still["padding_waste"]["waste_fraction"]["delta"] == pytest.approx(0.04)
    # these reports predate claims: the rule-name table puts each finding in its bucket
    buckets = {f["rule"]: f["bucket"] for f in found["resolved"] + found["still_present"]}
    assert buckets == {
        "data_stall": "data_wait",
        "tokenization_in_loop": "data_wait",
        "startup_idle": "startup",
        "padding_waste": "compute",
        "checkpoint_overhead": "checkpoint",
    }
    assert found["resolved"][2]["unit"] == "s/launch"


def test_deltas_are_after_minus_before(before: dict, after: dict) -> None:
    d = diff_reports(before, after)
    assert d["duration_s"]["delta"] == pytest.approx(1200.0 - 1843.2)
    step = d["step_time_p50_s"]
    assert (step["before"], step["after"], step["delta"]) == pytest.approx((1.02, 0.51, -0.51))
    assert step["verdict"] == "better"
    assert d["throughput_steps_per_s"]["ratio"] == pytest.approx(2.0)
    assert d["breakdown"]["data_wait"]["delta"] == pytest.approx(0.04 - 0.412)
    data_wait = d["seconds"]["data_wait"]
    assert data_wait["unit"] == "s/step"
    assert data_wait["before"] == pytest.approx(0.412 * 1843.2 / 1520)
    assert data_wait["after"] == pytest.approx(0.04 * 1200.0 / 1520)
    assert d["seconds"]["startup"]["unit"] == "s/launch"
    assert d["seconds"]["startup"]["before"] == pytest.approx(0.081 * 1843.2)
    assert d["wasted_usd_per_hour"]["delta"] == pytest.approx(0.6 - 1.3)


def test_missing_figures_give_null_deltas_not_zero(before: dict, after: dict) -> None:
    after["cost"]["wasted_usd_per_hour"] = None
    after["steps"]["step_time_s"]["p50"] = None
    d = diff_reports(before, after)
    assert d["wasted_usd_per_hour"]["delta"] is None
    assert d["throughput_steps_per_s"]["ratio"] is None
    assert "unavailable" in render_diff_markdown(d)


def test_identical_runs_have_nothing_resolved_or_new(before: dict) -> None:
    d = diff_reports(before, copy.deepcopy(before))
    assert d["findings"]["resolved"] == [] and d["findings"]["new"] == []
    assert all(c["delta"] == 0 for c in d["breakdown"].values())
    assert {c["verdict"] for c in d["seconds"].values()} == {"within_noise"}


def test_different_hardware_is_noted(before: dict, after: dict) -> None:
    after["run"]["gpus"][0]["name"] = "NVIDIA A100-SXM4-80GB"
    notes = diff_notes(diff_reports(before, after))
    assert any("different hardware" in n for n in notes)


def test_markdown_diff_reads_as_a_pr_comment(before: dict, after: dict) -> None:
    md = render_diff_markdown(diff_reports(before, after))
    assert md.startswith("### gpudoctor diff: steps 2.00× as fast")
    assert "| data wait | 0.5 s/step (41.2%) | 0.0316 s/step (4.0%) | −0.468 s/step |" in md
    assert "resolved `data_stall`" in md and "new `cpu_saturated`" in md
    assert "still present `padding_waste`" in md
    assert "| `data_stall` | resolved | 1.71× | 1.49× |" in md  # 0.919 × 1843.2 s / 0.95 × 1200 s


def test_diff_renderers_escape_run_strings(before: dict, after: dict) -> None:
    after["run"]["command"] = ["python", HOSTILE]
    after["findings"][-1]["rule"] = HOSTILE
    after["findings"][-1]["title"] = HOSTILE
    d = diff_reports(before, after)
    html = render_diff_html(d)
    assert "<script" not in html.lower() and "&lt;script&gt;" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    md = render_diff_markdown(d)
    prose = re.sub(r"(`+).*?\1", "", md)
    assert "<script" not in prose.lower()


def test_html_diff_shows_both_bars_and_the_changes(before: dict, after: dict) -> None:
    html = render_diff_html(diff_reports(before, after))
    assert html.count('<svg class="bar"') == 2
    assert "resolved" in html and "cpu_saturated" in html and "−0.468 s/step" in html
    assert "Predicted vs achieved" in html
