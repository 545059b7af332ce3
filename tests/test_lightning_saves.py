"""Lightning runs measured whole and fixed in Lightning's own arguments (``ModelCheckpoint``, ``Trainer``).

Issue #28, part 1: a Lightning save is ``Trainer.save_checkpoint``: a state dump, a
``torch.save`` into a memory buffer, the CheckpointIO's write to disk. Counting only the
``torch.save`` put a quarter of the cost in compute. The script (tests/scripts/lightning_ckpt.py)
times its own saves; the report must agree with it, and ``check`` must gate on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli, run_cli, within

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

pytest.importorskip("lightning")

SCRIPT = str(ROOT / "tests" / "scripts" / "lightning_ckpt.py")


def _run(tmp: Path, *script_args: str) -> tuple[dict[str, Any], dict[str, Any], Path]:
    folder, truth = tmp / "run", tmp / "truth.json"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, SCRIPT, "--dir", str(tmp / "ckpt"),
                   "--truth", str(truth), *script_args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((folder / "report.json").read_text()), json.loads(truth.read_text()), folder


@pytest.fixture(scope="module")
def every_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], Path]:
    return _run(tmp_path_factory.mktemp("lightning-every-1"), "--every", "1", "--steps", "30", "--mb", "48")


def test_the_whole_lightning_save_is_the_checkpoint_share(every_step):
    report, truth, _ = every_step
    assert truth["saves"] == 30
    true_share = truth["save_s"] / report["run"]["duration_s"]
    measured = report["breakdown"]["checkpoint"]
    assert within(measured, true_share), (measured, true_share)
    f = next(f for f in report["findings"] if f["rule"] == "checkpoint_overhead")
    assert f["data"]["saves"] == truth["saves"]
    assert "Trainer.save_checkpoint" in f["evidence"]


def test_the_fix_is_modelcheckpoint_arguments_of_the_installed_lightning(every_step):
    import lightning

    report, _, _ = every_step
    fix = next(f for f in report["findings"] if f["rule"] == "checkpoint_overhead")["fix"]
    assert fix["call"] == "ModelCheckpoint"
    assert fix["library"] == f"lightning {lightning.__version__} ModelCheckpoint"
    assert fix["config"]["every_n_train_steps"] > 1  # never the value that already ran
    assert fix["config"]["save_weights_only"] is True
    assert "save_steps" not in fix["config"] and "torch.save" not in fix["snippet"]
    assert fix["snippet"].startswith("ModelCheckpoint(")


def test_check_fails_the_lightning_run_that_saves_every_step(every_step):
    report, truth, folder = every_step
    # The gate at half the script's own saving share (startup's share varies with the machine's load).
    half = 0.5 * truth["save_s"] / report["run"]["duration_s"]
    proc = cli("check", str(folder), "--max-waste", f"{half:.3f}")
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_try_sets_modelcheckpoint_and_measures_it(tmp_path):
    folder = tmp_path / "try"
    proc = run_cli("try", "--fix", "checkpoint_overhead", "--seconds", "6", "--pairs", "1", "--out", str(folder), "--",
                   sys.executable, SCRIPT, "--dir",
                   str(tmp_path / "ckpt"), "--every", "1", "--steps", "400", "--mb", "48")
    assert proc.returncode == 0, proc.stderr[-2000:]
    trial = json.loads((folder / "report.json").read_text())["trial"]
    assert trial["rule"] == "checkpoint_overhead"
    applied = [row for row in trial["applied"] if row["call"] == "ModelCheckpoint"]
    assert applied and applied[0]["was"]["every_n_train_steps"] == 1
    assert applied[0]["values"]["every_n_train_steps"] == trial["values"]["model_checkpoint"]["every_n_train_steps"]
    assert trial["not_applied"] == []
    assert trial["baseline_steps_per_s"] and trial["trial_steps_per_s"]


def test_a_lightning_evals_fix_is_the_trainers_val_check_interval(tmp_path):
    import lightning

    report, _, _ = _run(tmp_path, "--no-ckpt", "--val-every", "2", "--val-batches", "40", "--steps", "60")
    f = next(f for f in report["findings"] if f["rule"] == "eval_overhead")
    fix = f["fix"]
    assert fix["call"] == "Trainer" and fix["library"] == f"lightning {lightning.__version__} Trainer"
    assert fix["config"]["val_check_interval"] > 2  # was 2
    assert "eval_interval" not in fix["config"] and "evaluate()" not in fix["snippet"]
    assert fix["snippet"].startswith("Trainer(..., val_check_interval=")
