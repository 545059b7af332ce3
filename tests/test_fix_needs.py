"""A fix that needs what the run does not have is not prescribed.

The Trainer's ``group_by_length`` sampler reads each item's ``input_ids`` (or a length column):
a run whose collator tokenizes raw text items crashes with it. Real small Trainer runs on the
CPU under ``gpudoctor run`` (tests/scripts/text_collator_trainer.py), one of each kind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

SCRIPT = ROOT / "tests" / "scripts" / "text_collator_trainer.py"


def _report(tmp_path: Path, *args: str) -> dict[str, Any]:
    folder = tmp_path / "run"
    proc = run_cli("run", "--no-timing", "--out", str(folder), "--", sys.executable, str(SCRIPT), "--out",
                   str(tmp_path / "out"), *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report: dict[str, Any] = json.loads((folder / "report.json").read_text())
    assert report["steps"]["count"] == 4
    return report


def _prescribed(report: dict[str, Any]) -> dict[str, Any]:
    finding = next((f for f in report["findings"] if f["rule"] == "padding_waste"), None)
    assert finding is not None, [f["rule"] for f in report["findings"]]
    out: dict[str, Any] = {}
    for table in [finding["fix"], *finding["fix"].get("also", [])]:
        out.update(table.get("config") or {})
    return out


def test_group_by_length_crashes_a_run_whose_items_have_no_input_ids(tmp_path):
    """The premise, on the installed transformers: that prescription would crash this run."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--raw-text", "--steps", "1", "--out",
                           str(tmp_path / "out"), "--train_sampling_strategy", "group_by_length"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode != 0 and "input_ids" in proc.stderr, proc.stderr[-2000:]


def test_custom_collator_over_raw_text_is_not_told_to_group_by_length(tmp_path):
    report = _report(tmp_path, "--raw-text")
    config = _prescribed(report)
    assert "train_sampling_strategy" not in config and "group_by_length" not in config, config
    # the padding fix itself is still given: each batch padded to its longest row (exactly, on a CPU)
    fix = next(f for f in report["findings"] if f["rule"] == "padding_waste")["fix"]
    assert "DataCollatorWithPadding(tokenizer)" in fix["snippet"] and "pad_to_multiple_of" not in config


def test_tokenized_items_are_told_to_group_by_length(tmp_path):
    config = _prescribed(_report(tmp_path))
    assert config.get("train_sampling_strategy") == "group_by_length", config


def test_item_keys_never_reads_the_patients_dataset():
    import torch
    from torch.utils.data import Dataset, IterableDataset

    from gpudoctor.hooks.dataset_items import item_keys

    class Rows(Dataset):
        reads = 0

        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> Any:
            Rows.reads += 1
            return {"pixel_values": torch.zeros(3), "label": i}

    class Pairs(Rows):
        def __getitem__(self, i: int) -> Any:
            return torch.zeros(3), i

    class Stream(IterableDataset):
        def __iter__(self) -> Any:
            raise AssertionError("read")

    # an extra dataset[0] would run the patient's code once more: keys unknown, nothing read
    assert item_keys(Rows()) is None and Rows.reads == 0
    assert item_keys(Pairs()) is None
    assert item_keys(Stream()) is None
