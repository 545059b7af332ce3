"""The same two reports give the same ``gpudoctor diff`` output, Markdown, HTML and JSON, byte for byte:
moving the diff's words out of its computation (issue #27) changes no figure and no sentence.

Pairs: a CPU run with a data stall and tokenizing in the loop before, the same loop fixed after (resolved
findings, step time better); the GPU run of :mod:`tests.test_report_golden` before, the CPU run after
(different hardware, findings gone and new); the hand-written report from before findings carried
``claims`` before and after its data fixes (relabelled and new findings) and against
itself (every change within noise). Goldens live in
``tests/data/golden/diff/``; to accept an intended change rerun with ``GPUDOCTOR_UPDATE_GOLDEN=1`` and
read the diff of the golden files before committing them.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.commands.load import load_report, read_report_bytes
from gpudoctor.render.diff_page import render_diff_html, render_diff_markdown
from gpudoctor.render.diff_words import diff_json
from gpudoctor.report.diff import diff_reports
from tests.recording_builder import RecordingBuilder
from tests.test_report_golden import _cpu_run, _gpu_run

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden" / "diff"


def _cpu_fixed(root: Path) -> RecordingBuilder:
    """The CPU run after the fix: tokenized ahead, padded less, the loop barely waits."""
    b = RecordingBuilder(root, cores=8, duration_s=40.0)
    rows = b.process(libs={"torch": "2.13.0", "transformers": "5.23.0", "tokenizers": "0.22.0"})
    b.training_loop(rows, start_s=5.0, steps=400, compute_s=0.05, wait_s=0.005, fetch_s=0.004,
                    jitter_s=0.005, seed=7)
    b.host_rows(cpu_total_pct=14.0, cpu_proc_pct=100.0)
    return b


def _recorded(make: Callable[[Path], RecordingBuilder]) -> Callable[[Path], dict[str, Any]]:
    def load(root: Path) -> dict[str, Any]:
        return dict(load_report(make(root).write()))
    return load


def _saved(root: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(read_report_bytes(DATA / "report_before_claims.json"))
    return report


def _saved_fixed(root: Path) -> dict[str, Any]:
    """The saved job after its data fixes (as in tests/test_diff.py): a finding relabelled, one new."""
    report = copy.deepcopy(_saved(root))
    report["run"]["duration_s"] = 1200.0
    report["breakdown"] = {"startup": 0.05, "data_wait": 0.04, "compute": 0.83, "checkpoint": 0.05,
                           "eval": 0.0, "other": 0.03}
    report["steps"]["step_time_s"] = {"p50": 0.51, "p90": 0.6}
    report["findings"] = [f for f in report["findings"] if f["rule"] in {"padding_waste", "checkpoint_overhead"}]
    report["findings"][0]["waste_fraction"] = 0.2
    report["findings"].append({"rule": "cpu_saturated", "severity": "medium", "title": "CPU saturated",
                               "waste_fraction": 0.06, "waste_usd_per_hour": 0.15,
                               "evidence": "4 workers use all 16 cores.",
                               "fix": {"summary": "Use 3 workers.", "config": {"dataloader_num_workers": 3},
                                       "snippet": None},
                               "predicted_speedup": 1.02})
    report["cost"].update(wasted_usd_per_hour=0.6, wasted_fraction=0.24)
    return report


PAIRS: dict[str, tuple[Callable[[Path], dict[str, Any]], Callable[[Path], dict[str, Any]]]] = {
    "cpu_fixed": (_recorded(_cpu_run), _recorded(_cpu_fixed)),
    "gpu_then_cpu": (_recorded(_gpu_run), _recorded(_cpu_run)),
    "saved_fixed": (_saved, _saved_fixed),
    "saved_same": (_saved, _saved),
}


def _outputs(tmp_path: Path, pair: str) -> dict[str, str]:
    make_before, make_after = PAIRS[pair]
    before, after = make_before(tmp_path / "before"), make_after(tmp_path / "after")
    for report in (before, after):  # the run folder is the only volatile figure a diff shows
        report["run"]["command"] = ["python", "train.py"]
    d = diff_reports(before, after)
    return {"md": render_diff_markdown(d), "html": render_diff_html(d), "json": diff_json(d)}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_same_reports_give_the_same_diff(tmp_path: Path, pair: str) -> None:
    got = _outputs(tmp_path, pair)
    assert str(tmp_path) not in "".join(got.values())
    assert json.loads(got["json"])["summary"], "a golden without a summary would hold its words to nothing"
    for ext, text in got.items():
        path = GOLDEN / f"{pair}.diff.{ext}"
        if os.environ.get("GPUDOCTOR_UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{path.name} changed"
