"""The model timed at several row widths after the run (issue #40 item 5): what is timed, where it
is kept, and what a hostile or broken file or class name gets."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.analysis import analyze, workload
from gpudoctor.launch import length_cost as timing
from gpudoctor.recording import length_cost
from gpudoctor.recording.store import load_recording
from tests.recording_builder import T0, RecordingBuilder

GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 300, "n_positions": 256}


def _padded(tmp_path: Path, model: dict[str, object], width: int = 256) -> Path:
    """A CPU run of 12 steps whose batches are 4 rows padded to ``width``, real rows ~40 tokens."""
    b = RecordingBuilder(tmp_path / "run", cores=2, duration_s=20.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=12, compute_s=0.5, wait_s=0.01)
    rows.append({"k": "torch_cfg", "t": T0 + 2.0, "cuda": False, "device": "cpu", "threads": 1, "autocast": False})
    rows.append({"k": "model", "t": T0 + 2.0, **model})
    for i in range(12):
        lengths = [30 + (7 * i + 11 * r) % 25 for r in range(4)]
        rows.append({"k": "batch", "t": T0 + 2.1 + i * 0.5, "tokens": 4 * width, "pad": 4 * width - sum(lengths),
                     "seq_len": width, "lengths": lengths})
    return b.write()


def test_a_transformers_model_is_timed_at_the_width_that_ran_and_narrower(tmp_path: Path) -> None:
    folder = _padded(tmp_path, {"class": "GPT2LMHeadModel", "params": 100_000, "config": GPT2})
    a = analyze(load_recording(folder))
    job = timing.job(a)
    assert job is not None and (job["model"], job["stand_in"], job["rows"]) == ("GPT2LMHeadModel", False, 4)
    # the width that ran, then where the fix goes (each batch's longest row, 54 at most: 56), then fractions
    assert job["widths"] == [256, 56, 128, 64, 32, 16]
    assert timing.measure(a, folder) is None
    kept = length_cost.read(folder)
    assert kept == a.rec.length_cost and kept is not None and not kept.stand_in
    assert [p.width for p in kept.points] == job["widths"] and all(p.seconds > 0 for p in kept.points)
    # a pass of this model takes milliseconds: three processes' draws fit the budget, their median kept
    assert kept.draws == 3
    assert not kept.kernels  # a CPU's passes are their work: no kernels timed beside them
    assert stat.S_IMODE(os.stat(folder / length_cost.FILE).st_mode) == 0o600
    # a later ``gpudoctor report`` reads what was timed, and times nothing again
    again = analyze(load_recording(folder))
    assert again.rec.length_cost == kept and timing.job(again) is None
    fit = workload.fit_measured([(p.rows, p.width, p.seconds) for p in kept.points])
    assert fit is not None and fit.batch_s(4, 256) > fit.batch_s(4, 64) > 0


def test_a_model_of_the_users_own_class_gets_a_gpt2_of_its_shape(tmp_path: Path) -> None:
    shape = {"matmul_params": 12 * 2 * 64 * 64 + 64 * 1000, "n_layers": 2, "hidden": 64, "attention": True}
    folder = _padded(tmp_path, {"class": "MyLM", "params": 300_000, "config": {}, "shape": shape})
    job = timing.job(analyze(load_recording(folder)))
    assert job is not None and job["stand_in"] and job["shown"] == "MyLM" and job["model"] == "GPT2LMHeadModel"
    assert job["config"] == {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 1, "vocab_size": 1000,
                             "n_positions": 256}
    # no attention named in the shape (a CNN, an MLP): nothing stands in, the FLOPs stand
    flat = _padded(tmp_path / "flat", {"class": "MyMLP", "params": 1000, "config": {}, "shape": {**shape, "attention": None}})
    assert timing.job(analyze(load_recording(flat))) is None


def test_a_class_transformers_does_not_export_is_never_built(tmp_path: Path) -> None:
    # not an identifier: refused before any child starts
    bad = _padded(tmp_path / "bad", {"class": "os.system", "params": 10, "config": GPT2})
    assert timing.job(analyze(load_recording(bad))) is None
    # an identifier transformers has, that is no model: the child refuses it and the report says so
    folder = _padded(tmp_path / "cfg", {"class": "AutoConfig", "params": 10, "config": GPT2})
    a = analyze(load_recording(folder))
    note = timing.measure(a, folder)
    assert note is not None and "not a transformers model class" in note and "uses its FLOPs" in note
    assert a.rec.length_cost is None and not (folder / length_cost.FILE).exists()


@pytest.mark.parametrize("doc", [
    {"schema": "other/1", "points": [[4, 64, 0.1], [4, 128, 0.2]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64, -0.1], [4, 128, 0.2]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64, True], [4, 128, 0.2]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64, 0.1, 0.0], [4, 128, 0.2, 0.1]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64, 0.1, 0.05, 1], [4, 128, 0.2, 0.1, 1]]},
    {"schema": length_cost.SCHEMA, "points": [[4, 64, 0.1]] * (length_cost.MAX_POINTS + 1)},
    [1, 2, 3],
])
def test_a_file_that_is_not_ours_is_refused_whole(doc: object) -> None:
    assert length_cost.parse(doc) is None


def test_a_planted_link_or_a_huge_file_is_never_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    good = {"schema": length_cost.SCHEMA, "device": "cpu", "points": [[4, 64, 0.1], [4, 128, 0.2]]}
    target.write_text(json.dumps(good))
    (tmp_path / length_cost.FILE).symlink_to(target)
    assert length_cost.read(tmp_path) is None
    (tmp_path / length_cost.FILE).unlink()
    (tmp_path / length_cost.FILE).write_text(json.dumps(good) + " " * length_cost.MAX_BYTES)
    assert length_cost.read(tmp_path) is None
    (tmp_path / length_cost.FILE).write_text(json.dumps(good))
    kept = length_cost.read(tmp_path)
    assert kept is not None and [(p.width, p.seconds) for p in kept.points] == [(64, 0.1), (128, 0.2)]


def test_sizes_that_build_more_than_the_training_had_are_refused(tmp_path: Path) -> None:
    # a recording's sizes are the patient's: counted on the meta device first, never built when they
    # ask for far more parameters than the training itself held
    huge = {**GPT2, "n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50_000}
    folder = _padded(tmp_path, {"class": "GPT2LMHeadModel", "params": 100_000, "config": huge})
    a = analyze(load_recording(folder))
    note = timing.measure(a, folder)
    assert note is not None and "parameters where the training had 100000" in note
    assert a.rec.length_cost is None and not (folder / length_cost.FILE).exists()


def test_the_widths_a_fix_goes_to_are_timed_before_the_fractions() -> None:
    """A slow wide pass can spend the budget: the widths the prediction is read at come right after the
    width that ran (the batches' median longest row, where most batches after the fix sit, then the
    widest and the p99 cap), each rounded up to 8."""
    batches = [{"lengths": [100, 300]}, {"lengths": [222, 400]}, {"lengths": [460, 90]}]
    assert timing.widths_to_time(1024, batches, 455) == [1024, 400, 464, 456, 512, 256, 128, 64]
    # rows as long as the width that ran: nothing narrower for the fix, only the fractions
    assert timing.widths_to_time(128, [{"lengths": [128]}], 128) == [128, 64, 32, 16]


def test_a_gpus_kernels_alone_are_kept_beside_the_passes_only_as_a_whole_curve(tmp_path: Path) -> None:
    """A GPU's child times each width's kernels alone beside its pass: they travel as a fourth
    column, round-trip through the file, and make a curve only where every draw timed every width."""
    gpu = [[[16, 1024, 0.0209, 0.0195], [16, 224, 0.0098, 0.0048], [16, 64, 0.0096, 0.0021]],
           [[16, 1024, 0.0208, 0.0190], [16, 224, 0.0097, 0.0046], [16, 64, 0.0097, 0.0020]],
           [[16, 1024, 0.0211, 0.0196], [16, 224, 0.0099, 0.0049], [16, 64, 0.0095, 0.0022]]]
    points = timing.points_of([timing.parse_draw(d) for d in gpu], 16)
    assert [q.width for q in points] == [1024, 224, 64]
    assert [round(q.kernel_s or 0, 4) for q in points] == [0.0195, 0.0048, 0.0021]  # the draws' median
    cost = length_cost.LengthCost(points, "cuda", None, "GPT2LMHeadModel", None, draws=3)
    assert cost.kernels
    length_cost.write(tmp_path, cost)
    assert length_cost.read(tmp_path) == cost
    # one draw whose kernels were not timed (its host met the GPU): the passes stand alone
    partial = [*gpu[:2], [row[:3] for row in gpu[2]]]
    alone = timing.points_of([timing.parse_draw(d) for d in partial], 16)
    assert [q.kernel_s for q in alone] == [None, None, None] and [q.width for q in alone] == [1024, 224, 64]
    assert not length_cost.LengthCost(alone, "cuda", None, "GPT2LMHeadModel", None, draws=3).kernels
