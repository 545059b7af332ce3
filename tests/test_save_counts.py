"""Each save counted once, by kind: periodic checkpoints, the final save, side files.

Real runs under ``gpudoctor run``: a Trainer with save_steps dividing max_steps saves a
checkpoint after its last step and then ``save_model()`` (the model plus
``training_args.bin``): the checkpoints are exactly the periodic ones, the final save
is reported separately, and ``training_args.bin`` is a side file, not a save.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_trainer_periodic_checkpoints_final_save_and_side_files_counted_apart(probe_run):
    run = probe_run("hf_trainer", "--final-save", doctor_args=("--no-timing",))  # counts, not a prediction
    assert run.returncode == 0, run.stderr[-2000:]
    saves = run.report["saves"]
    assert run.truth["checkpoints"] == run.truth["global_step"] // run.truth["save_steps"]  # 20 / 5
    assert saves["checkpoints"] == run.truth["checkpoints"]
    assert saves["final"] == run.truth["final_saves"] == 1
    assert saves["side_files"] >= 1  # training_args.bin, at least the final one


def test_a_save_after_the_last_step_on_cadence_is_a_checkpoint(probe_run):
    run = probe_run("heavy_checkpoints")
    assert run.report["saves"]["checkpoints"] == run.truth["checkpoints"]
    assert run.report["saves"]["final"] == 0
    assert run.finding("checkpoint_overhead")["data"]["saves"] == run.truth["checkpoints"]
