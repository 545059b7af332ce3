"""``gpudoctor try`` says a trial that crashed is a crash, and refuses a bad ``--set`` before
anything runs (issue #28, part 3).

tests/scripts/worker_unsafe_loop.py builds its batches slowly and its dataset raises inside a
DataLoader worker (an open handle that cannot cross a fork): a trial with workers crashes.
"""

from __future__ import annotations

import json
import sys

from gpudoctor.tryfix import plan as planning
from tests.conftest import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "worker_unsafe_loop.py")


def test_a_set_the_trial_cannot_apply_is_refused_before_the_baseline(tmp_path):
    out = tmp_path / "try"
    proc = run_cli("try", "--seconds", "3", "--out", str(out), "--set", "num_workers=2", "--set", "bogus=1",
                   "--", sys.executable, SCRIPT)
    assert proc.returncode == 2
    assert "--set bogus: not an argument the trial can set" in proc.stderr
    assert "baseline" not in proc.stderr and not out.exists()  # nothing ran, nothing written
    typed = run_cli("try", "--seconds", "3", "--out", str(out), "--set", "num_workers=two", "--", sys.executable,
                    SCRIPT)
    assert typed.returncode == 2 and "num_workers takes a whole number" in typed.stderr and not out.exists()


def test_keys_some_call_takes_pass_the_early_check():
    planning.check_sets({"padding": "longest", "num_workers": 2, "every_n_train_steps": 10,
                         "save_only_model": True})  # a tokenizer's, DataLoader's, ModelCheckpoint's, Trainer's


def test_a_trial_that_crashes_is_reported_as_a_crash(tmp_path):
    out = tmp_path / "try"
    proc = run_cli("try", "--seconds", "5", "--out", str(out), "--set", "num_workers=1", "--", sys.executable,
                   SCRIPT)
    assert proc.returncode != 0, proc.stderr[-2000:]
    headline = next(line for line in proc.stderr.splitlines() if line.startswith("gpudoctor try: ") and
                    "CRASHED" in line)
    assert "records handle opened in the main process cannot be used in a worker" in headline
    assert "achieved" not in headline and "raise --seconds" not in headline
    trial = json.loads((out / "report.json").read_text())["trial"]
    assert trial["achieved_speedup"] is None and trial["trial_steps_per_s"] is None
    crash = trial["trial_run"]["crash"]
    assert crash["exit_code"] != 0
    assert crash["last_lines"][0].startswith("RuntimeError: records handle")
    assert trial["unmeasured"].startswith("the trial crashed")
