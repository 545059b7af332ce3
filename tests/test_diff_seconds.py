"""An honest diff: seconds per step against the runs' own noise, on real recordings.

Each before/after pair is two recordings in the on-disk format, turned into
reports by the real pipeline, then diffed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis import step_noise
from gpudoctor.recording.store import load_recording
from gpudoctor.render.diff_page import render_diff_html, render_diff_markdown
from gpudoctor.render.diff_words import notes as diff_notes
from gpudoctor.render.diff_words import summary_line
from gpudoctor.report.build import build_report
from gpudoctor.report.diff import diff_reports
from tests.recording_builder import T0, RecordingBuilder

STEPS = 1000


def loop_report(root: Path, *, wait_s: float = 0.04, compute_s: float = 0.05, workers: int = 0,
                cpu_total_pct: float = 50.0, tokenize_s: float = 0.0, format_s: float = 0.0,
                jitter_s: float = 0.01, seed: int = 1, cores: int = 2) -> dict[str, Any]:
    """5 s of imports (plus ``format_s`` of dataset formatting), then STEPS steps of wait + compute."""
    start = 5.0 + format_s
    b = RecordingBuilder(root, cores=cores, duration_s=start + STEPS * (wait_s + compute_s) + 5.0)
    rows = b.process()
    if format_s:
        rows.append({"k": "span", "c": "format", "t0": T0 + 1.0, "dt": format_s, "name": "Dataset.map"})
    end = b.training_loop(rows, start_s=start, steps=STEPS, compute_s=compute_s, wait_s=wait_s,
                          fetch_s=wait_s, num_workers=workers, jitter_s=jitter_s, seed=seed)
    if tokenize_s:
        b.tokenizer_counters(rows, start_s=start, end_s=end, total_s=tokenize_s)
    b.host_rows(cpu_total_pct=cpu_total_pct, cpu_proc_pct=100.0)
    return build_report(load_recording(b.write()))


def rules(report: dict[str, Any]) -> set[str]:
    return {f["rule"] for f in report["findings"] if f["severity"] != "info"}


def statuses(d: dict[str, Any]) -> dict[str, list[str]]:
    return {k: [f["rule"] for f in v] for k, v in d["findings"].items() if v}


@pytest.fixture
def tokenizing(tmp_path: Path) -> dict[str, Any]:
    """The loop waits 40 ms a step, 36 ms of it the training process tokenizing."""
    report = loop_report(tmp_path / "before", tokenize_s=0.036 * STEPS)
    assert rules(report) == {"tokenization_in_loop"}
    return report


def test_relabelled_waste_is_moved_not_resolved(tmp_path: Path, tokenizing: dict) -> None:
    # The "fix" moved tokenizing into one worker on a 2-core machine: the cores saturate and the
    # loop waits exactly as long; the rule that explains the wait changes, the wait does not.
    after = loop_report(tmp_path / "after", workers=1, cpu_total_pct=97.0, seed=2)
    assert rules(after) == {"cpu_saturated"}
    d = diff_reports(tokenizing, after)
    assert statuses(d) == {"moved": ["tokenization_in_loop"]}
    moved = d["findings"]["moved"][0]
    assert moved["moved_to"] == ["cpu_saturated"]
    assert moved["bucket"] == "data_wait" and moved["bucket_s"]["verdict"] == "within_noise"
    assert moved["bucket_s"]["before"] == pytest.approx(0.04, abs=1e-3)
    # the waste is still there: none of its seconds were removed
    assert moved["waste_s"]["after"] == pytest.approx(moved["waste_s"]["before"])
    # its fix was applied (the finding is gone): predicted next to what was achieved
    # ... the steady-state figure (startup left out), beside seconds per step: like with like (#40)
    finding = next(f for f in tokenizing["findings"] if f["rule"] == "tokenization_in_loop")
    assert moved["speedup"]["predicted"] == finding["predicted_speedup"]
    assert finding["whole_run_speedup"] == pytest.approx(1 / (1 - finding["waste_fraction"]), abs=0.01)
    assert finding["whole_run_speedup"] < finding["predicted_speedup"]
    assert moved["speedup"]["achieved"] == pytest.approx(1.0, abs=0.02)
    assert "relabelled: tokenization_in_loop → cpu_saturated, data wait 0.04 → 0.04 s/step" in summary_line(d)
    assert "resolved" not in summary_line(d).replace("not resolved", "")
    md = render_diff_markdown(d)
    assert "✅" not in md and "relabelled, not resolved `tokenization_in_loop` → `cpu_saturated`" in md
    html = render_diff_html(d)
    assert "relabelled, not resolved" in html and 'class="delta-good"' not in html


def test_real_fix_beyond_noise_is_resolved_with_predicted_vs_achieved(
    tmp_path: Path, tokenizing: dict
) -> None:
    # Pre-tokenized: batches arrive in 2 ms.
    after = loop_report(tmp_path / "after", wait_s=0.002, seed=2)
    assert rules(after) == set()
    d = diff_reports(tokenizing, after)
    assert statuses(d) == {"resolved": ["tokenization_in_loop"]}
    f = d["findings"]["resolved"][0]
    assert f["bucket_s"]["verdict"] == "better"
    assert f["waste_s"]["before"] == pytest.approx(0.036, abs=1e-3)
    assert f["waste_s"]["after"] == pytest.approx(0.0, abs=1e-3)
    predicted = next(x for x in tokenizing["findings"] if x["rule"] == "tokenization_in_loop")
    assert f["speedup"]["predicted"] == predicted["predicted_speedup"]
    # achieved = before s/step / after s/step, from the two runs' own seconds
    loop_b = sum(d["seconds"][k]["before"] for k in d["seconds"] if k != "startup")
    loop_a = sum(d["seconds"][k]["after"] for k in d["seconds"] if k != "startup")
    assert f["speedup"]["achieved"] == pytest.approx(loop_b / loop_a)
    assert f["speedup"]["achieved"] > 1.5
    assert d["step_time_p50_s"]["verdict"] == "better" and d["seconds"]["data_wait"]["verdict"] == "better"
    achieved = f"{f['speedup']['achieved']:.2f}×"
    md = render_diff_markdown(d)
    assert md.startswith("### gpudoctor diff: steps 1.")
    assert f"| `tokenization_in_loop` | resolved | {predicted['predicted_speedup']:.2f}× | {achieved} |" in md
    html = render_diff_html(d)
    assert "Predicted vs achieved" in html and achieved in html
    assert json.loads(json.dumps(d))["findings"]["resolved"][0]["speedup"] == f["speedup"]


def test_startup_fix_is_judged_per_launch(tmp_path: Path) -> None:
    before = loop_report(tmp_path / "before", wait_s=0.0, format_s=20.0)
    assert "startup_idle" in rules(before)
    after = loop_report(tmp_path / "after", wait_s=0.0, seed=2)
    d = diff_reports(before, after)
    assert statuses(d) == {"resolved": ["startup_idle"]}
    f = d["findings"]["resolved"][0]
    assert f["unit"] == "s/launch"
    assert (f["bucket_s"]["before"], f["bucket_s"]["after"]) == pytest.approx((25.0, 5.0), abs=0.01)
    wall = d["duration_s"]["before"]
    assert f["speedup"]["achieved"] == pytest.approx(wall / (wall - 20.0), rel=1e-3)


def test_change_inside_the_noise_is_neutral(tmp_path: Path) -> None:
    # The same job twice (8 cores, too few workers), the second 0.5 ms a step slower: noise.
    before = loop_report(tmp_path / "before", cores=8, cpu_total_pct=20.0, seed=1)
    after = loop_report(tmp_path / "after", cores=8, cpu_total_pct=20.0, compute_s=0.0505, seed=2)
    assert rules(before) == rules(after) == {"data_stall"}
    d = diff_reports(before, after)
    assert d["seconds"]["compute"]["delta"] == pytest.approx(0.0005, abs=2e-4)
    assert d["noise"]["threshold_s_per_step"] > d["seconds"]["compute"]["delta"]
    assert d["step_time_p50_s"]["verdict"] == "within_noise"
    assert {c["verdict"] for c in d["seconds"].values()} == {"within_noise"}
    assert statuses(d) == {"still_present": ["data_stall"]}
    assert d["findings"]["still_present"][0]["verdict"] == "within_noise"
    assert summary_line(d).startswith("step time unchanged within noise")
    md = render_diff_markdown(d)
    assert "(within noise)" in md and "×" not in md.splitlines()[0]
    html = render_diff_html(d)
    assert not re.search(r'class="[^"]*delta-(good|bad)', html)


def test_seconds_per_step_not_points_drive_the_verdict(tmp_path: Path, tokenizing: dict) -> None:
    # A slower model: compute doubles, the same 40 ms wait (36 ms tokenizing) now is a smaller
    # share of a longer wall. In points the waste fell by a third; in seconds it did not move.
    after = loop_report(tmp_path / "after", compute_s=0.1, tokenize_s=0.036 * STEPS, seed=2)
    d = diff_reports(tokenizing, after)
    assert d["breakdown"]["data_wait"]["delta"] < -0.1
    assert d["seconds"]["data_wait"]["verdict"] == "within_noise"
    assert d["seconds"]["compute"]["verdict"] == "worse"
    still = d["findings"]["still_present"][0]
    assert still["rule"] == "tokenization_in_loop"
    assert still["waste_fraction"]["delta"] < -0.05
    assert still["verdict"] == "within_noise"
    assert d["step_time_p50_s"]["verdict"] == "worse"
    assert summary_line(d).startswith("steps 1.")
    assert "slower" in summary_line(d)
    md = render_diff_markdown(d)
    assert re.search(r"\| data wait \| 0\.04 s/step \(\d+\.\d%\) \| 0\.04 s/step .*\(within noise\) \|", md)


def test_noise_comes_from_the_runs_own_step_times(tmp_path: Path) -> None:
    steady = loop_report(tmp_path / "steady", jitter_s=0.0)
    jittery = loop_report(tmp_path / "jittery", jitter_s=0.01)
    assert step_noise.estimate(steady).noise_s == pytest.approx(0.0, abs=1e-6)
    noisy = step_noise.estimate(jittery)
    assert noisy.method == "step_times" and noisy.steps == STEPS - 1
    # uniform ±10 ms: 1.4826 × MAD = 1.4826 × 5 ms, to the millisecond the timeline keeps
    assert noisy.spread_s == pytest.approx(0.0074, abs=0.0015)
    assert 0 < noisy.noise_s < noisy.spread_s
    # a report without step timestamps falls back on its p50 and p90, and says so
    del jittery["timeline"]
    fallback = step_noise.estimate(jittery)
    assert fallback.method == "p50_p90" and fallback.drift_s is None and fallback.noise_s > 0
    # no steps at all: no noise, and every change is unavailable rather than judged
    jittery["steps"] = {"count": 0, "step_time_s": {"p50": None, "p90": None}}
    d = diff_reports(steady, jittery)
    assert d["noise"]["threshold_s_per_step"] is None
    assert d["step_time_p50_s"]["verdict"] == "unavailable"
    assert any("no step times" in n for n in diff_notes(d))


def test_a_fall_that_leaves_waste_beyond_the_noise_is_partial(tmp_path: Path, tokenizing: dict) -> None:
    # The wait falls from 40 to 25 ms, and what is left is now blamed on busy cores.
    after = loop_report(tmp_path / "after", wait_s=0.025, workers=1, cpu_total_pct=97.0, seed=2)
    d = diff_reports(tokenizing, after)
    assert statuses(d) == {"partial": ["tokenization_in_loop"]}
    f = d["findings"]["partial"][0]
    assert f["waste_s"]["after"] == pytest.approx(0.036 - 0.015, abs=1e-3)
    assert f["moved_to"] == ["cpu_saturated"]
    assert "partly resolved tokenization_in_loop" in summary_line(d)
