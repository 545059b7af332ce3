"""An image pipeline's CPU-bound data fix speaks of decoding and augmentation, not tokenizing.

A real PIL loop under ``gpudoctor run`` records what its items are made with (the loader event's
``item_libs``); a recording of a CPU-saturated run (a 2-core box at 97%, which a shared test
machine cannot be made to be) carries that very loader event, and ``cpu_saturated``'s fix is read.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.conftest import ROOT, run_cli
from tests.recording_builder import T0, RecordingBuilder


def _real_events(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The real PIL loop's loader and model events."""
    folder = tmp_path / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable,
                   str(ROOT / "tests" / "scripts" / "pil_images_loop.py"), "--data", str(tmp_path / "png"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for f in (folder / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    [loader] = [e for e in events if e["k"] == "loader"]
    [model] = [e for e in events if e["k"] == "model"]
    return loader, model


def _cpu_saturated_fix(tmp_path: Path, loader: dict[str, Any], *, tokenize_calls: int = 0) -> dict[str, Any]:
    b = RecordingBuilder(tmp_path / "rec", cores=2, duration_s=80.0)
    rows = b.process()
    b.training_loop(rows, start_s=5.0, steps=600, compute_s=0.05, wait_s=0.1, fetch_s=0.1)
    recorded = next(r for r in rows if r["k"] == "loader")
    recorded["item_keys"], recorded["item_libs"] = loader.get("item_keys"), loader.get("item_libs")
    if tokenize_calls:
        rows.append({"k": "counter", "t": T0 + 90, "name": "tokenize", "calls": tokenize_calls, "s": 5.0})
    b.host_rows(cpu_total_pct=97.0, cpu_proc_pct=100.0)
    report = build_report(load_recording(b.write()))
    found = next((f for f in report["findings"] if f["rule"] == "cpu_saturated"), None)
    assert found is not None, [f["rule"] for f in report["findings"]]
    fix: dict[str, Any] = found["fix"]
    return fix


def test_pil_loop_is_told_to_cache_decoded_images_and_augment_on_the_gpu(tmp_path):
    loader, model = _real_events(tmp_path)
    assert "PIL" in loader["item_libs"], loader
    # its convolution and image batch, what the warm-compute stand-in replays; a lazy layer's weight
    # has no size before the first forward: left out, and the weight count unknown rather than raised on
    assert model["shape"] == {"layers": [["conv", 3, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1]], "input": [4, 3, 32, 32]}
    assert model["params"] is None
    fix = _cpu_saturated_fix(tmp_path, loader)
    words = fix["summary"] + fix["snippet"]
    assert "tokeniz" not in words and "ds.map" not in fix["snippet"], fix
    assert "Decode and resize" in fix["summary"] and "augmentation" in fix["summary"]
    assert "Image.open" in fix["snippet"] and "v2." in fix["snippet"] and "DALI" in fix["snippet"]
    workers = fix["config"].get("num_workers", loader.get("num_workers") or 0)  # {}: the value that ran
    assert f"num_workers={workers}" in fix["snippet"]  # one value per knob
    ast.parse(fix["snippet"])


def test_a_tokenizing_run_keeps_the_text_words(tmp_path):
    text_loader = {"item_keys": ["input_ids", "attention_mask"], "item_libs": ["torch"]}
    fix = _cpu_saturated_fix(tmp_path, text_loader)
    assert "tokenizing" in fix["summary"] and "ds.map(" in fix["snippet"]
    # an image library in the items but tokenizer calls in the process: still text
    fix = _cpu_saturated_fix(tmp_path / "both", {"item_keys": [], "item_libs": ["PIL", "torch"]}, tokenize_calls=600)
    assert "ds.map(" in fix["snippet"]
