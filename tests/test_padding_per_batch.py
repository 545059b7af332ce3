"""Padding that is already per batch (issue #40 item 9): never told to "pad per batch"; the rows of
unlike lengths in one batch are what is left, and sorting them into batches by length is the fix."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.conftest import ROOT, run_cli
from tests.recording_builder import T0, RecordingBuilder

SHAPE = {"matmul_params": 12 * 2 * 64 * 64 + 64 * 1000, "n_layers": 2, "hidden": 64, "attention": True}


def _report(tmp_path: Path, *, per_batch: bool, steps: int = 60, rows: int = 16) -> dict[str, Any]:
    """A CPU loop whose rows are 8..120 tokens: each batch padded to its longest row (``per_batch``)
    or every row to 128."""
    rng = random.Random(7)
    b = RecordingBuilder(tmp_path, cores=2, duration_s=5.0 + steps * 0.1 + 2.0)
    proc = b.process()
    b.training_loop(proc, start_s=5.0, steps=steps, compute_s=0.09, wait_s=0.01)
    proc.append({"k": "model", "t": T0 + 5.0, "class": "MyLM", "params": 300_000, "config": {}, "shape": SHAPE})
    for i in range(steps):
        lengths = [rng.randint(8, 120) for _ in range(rows)]
        width = -(-max(lengths) // 8) * 8 if per_batch else 128
        proc.append({"k": "batch", "t": T0 + 5.0 + 0.1 * i + 0.005, "tokens": rows * width,
                     "pad": rows * width - sum(lengths), "seq_len": width, "lengths": lengths})
    return build_report(load_recording(b.write()))


def _padding(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule"] == "padding_waste"), None)


def test_rows_padded_per_batch_are_told_to_sort_by_length_not_to_pad_per_batch(tmp_path: Path) -> None:
    f = _padding(_report(tmp_path / "per-batch", per_batch=True))
    assert f is not None
    summary = f["fix"]["summary"]
    assert "Pad per batch" not in summary and summary.startswith("Rows are already padded per batch")
    assert "sort rows into batches of similar length" in summary
    assert f["data"]["rows_after"] == "bucketed" and f["data"]["new_max_length"] is None
    assert f["fix"]["config"] == {} and "batch_sampler=batches" in f["fix"]["snippet"]
    # one prediction, the bucketing's: fewer tokens than per-batch padding leaves (sorted rows)
    assert 0.05 <= 1 - f["data"]["compute_after_ratio"] < f["data"]["pad_fraction"]
    assert f["predicted_speedup"] > 1.0 and f["predicted_speedup_range"] is None


def test_rows_padded_to_one_width_are_still_told_to_pad_per_batch(tmp_path: Path) -> None:
    f = _padding(_report(tmp_path / "fixed", per_batch=False))
    assert f is not None and f["fix"]["summary"].startswith("Pad per batch instead of to 128")
    assert f["data"]["rows_after"] != "bucketed"
    # the prediction is the configured fix's alone, never packing's beside it (#40 item 1)
    compute = [c for c in f["claims"] if c["bucket"] == "compute"]
    assert len(compute) == 1 and compute[0]["fraction"] == pytest.approx(1 - f["data"]["compute_after_ratio"], abs=1e-3)


def test_a_cap_counts_what_it_cuts_over_every_row_of_a_datasets_table(tmp_path: Path) -> None:
    """The batches show 41 x 8 rows; the hooks read all 1500 rows' lengths from the table's Arrow
    column (a shuffled, selected view: its own rows), and the cap's cut is counted over them (#40 item 7)."""
    truth = tmp_path / "lengths.json"
    out = tmp_path / "run"
    proc = run_cli("run", "--out", str(out), "--no-history", "--", sys.executable,
                   str(ROOT / "tests" / "scripts" / "padded_table.py"), str(truth), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    f = _padding(report)
    assert f is not None
    data, lengths = f["data"], json.loads(truth.read_text())
    assert data["rows_counted_from"] == "dataset" and data["rows_seen"] == len(lengths) == 1500
    new_max = data["new_max_length"]
    assert new_max is not None and data["rows_truncated"] == sum(n > new_max for n in lengths) > 0
    assert "of all 1500 rows of the dataset" in f["fix"]["summary"]
