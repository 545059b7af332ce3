"""The widths a per-batch padding fix predicts are the widths it gives (#40): exact on a CPU, a
tensor-core multiple on CUDA, the script's own padding flag set where it has one, and the mean
longest row of a batch read from every row seen when only a few batches were seen."""

from __future__ import annotations

import math
import random
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from gpudoctor.rules.batches import _drawn_batches
from tests.recording_builder import T0, RecordingBuilder
from tests.test_report_golden import _cpu_run

SHAPE = {"matmul_params": 12 * 2 * 64 * 64 + 64 * 1000, "n_layers": 2, "hidden": 64, "attention": True}


def _padded(tmp_path: Path, *, cuda: bool = False, options: list[dict[str, Any]] | None = None,
            args: list[str] | None = None) -> dict[str, Any]:
    """A loop whose rows (8..120 tokens) are all padded to 128."""
    rng = random.Random(7)
    b = RecordingBuilder(tmp_path, cores=2, duration_s=15.0)
    proc = b.process()
    b.training_loop(proc, start_s=5.0, steps=60, compute_s=0.09, wait_s=0.01)
    proc.append({"k": "model", "t": T0 + 5.0, "class": "MyLM", "params": 300_000, "config": {}, "shape": SHAPE})
    proc.append({"k": "torch_cfg", "t": T0 + 5.0, "cuda": cuda, "device": "cuda:0" if cuda else "cpu"})
    if options is not None:
        proc[0]["argv"] = ["/usr/bin/python3", "train.py", *(args or [])]
        b.meta_extra["command"] = ["python", "train.py", *(args or [])]
        proc.append({"k": "cli", "t": T0 + 0.5, "style": "argparse", "parser": "ArgumentParser",
                     "from_argv": True, "args": None, "options": options})
    for i in range(60):
        lengths = [rng.randint(8, 120) for _ in range(16)]
        proc.append({"k": "batch", "t": T0 + 5.0 + 0.1 * i + 0.005, "tokens": 16 * 128,
                     "pad": 16 * 128 - sum(lengths), "seq_len": 128, "lengths": lengths})
    return build_report(load_recording(b.write()))


def _padding(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["rule"] == "padding_waste")


def test_a_cpu_run_pads_each_batch_exactly_and_a_cuda_run_to_a_tensor_core_multiple(tmp_path: Path) -> None:
    cpu, gpu = _padding(_padded(tmp_path / "cpu")), _padding(_padded(tmp_path / "gpu", cuda=True))
    assert "pad_to_multiple_of" not in cpu["fix"]["config"] and "pad_to_multiple_of" not in cpu["fix"]["snippet"]
    multiple = gpu["fix"]["config"]["pad_to_multiple_of"]
    assert multiple in (8, 16, 32, 64) and f"(multiple of {multiple})" in gpu["evidence"]
    # the rounded widths are more tokens: the CPU's exact widths keep fewer
    assert cpu["data"]["tokens_dynamic"] < gpu["data"]["tokens_dynamic"]


def _opt(dest: str, flag: str, value: object, choices: list[object] | None = None) -> dict[str, object]:
    out: dict[str, object] = {"dest": dest, "flags": [flag], "default": value, "value": value,
                              "takes_value": True, "const": None}
    if choices is not None:
        out["choices"] = choices
    return out


def test_the_scripts_own_padding_choice_is_set_beside_its_max_length(tmp_path: Path) -> None:
    args = ["--max-length", "128", "--pad", "max_length"]
    report = _padded(tmp_path, options=[_opt("max_length", "--max-length", 128),
                                        _opt("pad", "--pad", "max_length", ["max_length", "longest"])], args=args)
    f = _padding(report)
    new = f["data"]["new_max_length"]
    assert f["fix"]["summary"].startswith(f"Run with `--pad longest` instead of max_length and `--max-length {new}` "
                                          "instead of 128.")
    argv = shlex.split(f["data"]["command_line"])
    assert argv == ["python", "train.py", "--max-length", str(new), "--pad", "longest"]


def test_a_pad_option_that_cannot_say_longest_is_left_alone(tmp_path: Path) -> None:
    """``--pad 0`` (a pad token id) and ``--pad`` whose choices lack "longest" are not the padding knob."""
    for options in ([_opt("pad", "--pad", 0)], [_opt("pad", "--pad", "max_length", ["max_length", "none"])]):
        report = _padded(tmp_path / str(len(options[0])), options=[_opt("max_length", "--max-length", 128),
                                                                   *options], args=["--max-length", "128"])
        f = _padding(report)
        assert "--pad" not in f["data"]["command_line"] and "--pad" not in f["fix"]["summary"]
        assert f["fix"]["config"]["padding"] == "longest"  # the library's spelling stays for the rest


def _population_max(rng: random.Random, rows: int) -> float:
    """The mean longest of ``rows`` rows of log-normal length (median 200), capped at 1024, by simulation."""
    return statistics.fmean(min(1024, max(math.ceil(rng.lognormvariate(math.log(200), 0.55))
                                          for _ in range(rows))) for _ in range(4000))


def _lognormal_batches(rng: random.Random, seen: int) -> list[dict[str, Any]]:
    """``seen`` batches of 16 rows drawn as :func:`_population_max` draws them, padded to 1024."""
    return [{"seq_len": 1024, "tokens": 16 * 1024,
             "lengths": [min(1024, math.ceil(rng.lognormvariate(math.log(200), 0.55))) for _ in range(16)]}
            for _ in range(seen)]


def test_few_batches_read_the_mean_longest_row_from_every_row_seen() -> None:
    """Three batches of 16 rows padded to 1024 (about three slow steps): over 20 such recordings the
    drawn batches' mean longest row misses the population's by less than the three maxima seen do."""
    rng = random.Random(3)
    truth = _population_max(random.Random(4), 16)
    seen_err, drawn_err = [], []
    for _ in range(20):
        batches = _lognormal_batches(rng, 3)
        drawn = _drawn_batches(batches, 1, None)
        assert drawn is not None and len(drawn) % 3 == 0
        seen_err.append(abs(statistics.fmean(max(b["lengths"]) for b in batches) - truth) / truth)
        drawn_err.append(abs(statistics.fmean(w for _, w in drawn) - truth) / truth)
    assert statistics.fmean(drawn_err) < statistics.fmean(seen_err)
    assert statistics.fmean(drawn_err) < 0.12


@pytest.mark.parametrize("seen", [6, 12, 24])
def test_the_drawn_longest_rows_are_not_drawn_longer_than_the_rows_run(seen: int) -> None:
    """A smoothed bootstrap's jitter widens the rows' spread, and the longest of 16 rows grows with it:
    over 30 recordings of ``seen`` batches the drawn mean longest row stood 4.4-5.5% above the
    population's (a padding fix's compute after read too high, its speedup too low). Shrunk back to
    the rows' own spread, its bias is within 3.5% either way."""
    truth = _population_max(random.Random(4), 16)
    rng = random.Random(3)
    errors = []
    for _ in range(30):
        batches = _lognormal_batches(rng, seen)
        drawn = _drawn_batches(batches, 1, None)
        assert drawn is not None
        errors.append((statistics.fmean(w for _, w in drawn) - truth) / truth)
    assert abs(statistics.fmean(errors)) < 0.035, statistics.fmean(errors)


def test_batches_sorted_by_length_or_many_are_not_drawn() -> None:
    ordered = sorted(random.Random(5).randint(10, 900) for _ in range(48))
    sorted_batches = [{"seq_len": 1024, "tokens": 16 * 1024, "lengths": ordered[i:i + 16]} for i in range(0, 48, 16)]
    assert _drawn_batches(sorted_batches, 1, None) is None  # each batch's spread far under the rows'
    many = [{"seq_len": 1024, "tokens": 4096, "lengths": [10, 500, 90, 300]} for _ in range(40)]
    assert _drawn_batches(many, 1, None) is None


def _timed_report(folder: Path, timed: tuple[tuple[int, float], ...], draws: int) -> dict[str, Any]:
    """The padding finding of a 12-step CPU run (0.5 s of compute a step, 4 rows padded to 256) whose
    timing child left ``timed`` (width, seconds) from ``draws`` processes."""
    from gpudoctor.recording import length_cost

    b = RecordingBuilder(folder, cores=2, duration_s=20.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=12, compute_s=0.5, wait_s=0.01)
    rows.append({"k": "torch_cfg", "t": T0 + 2.0, "cuda": False, "device": "cpu", "threads": 1})
    for i in range(12):
        lengths = [30 + (7 * i + 11 * r) % 25 for r in range(4)]
        rows.append({"k": "batch", "t": T0 + 2.1 + i * 0.5, "tokens": 4 * 256, "pad": 4 * 256 - sum(lengths),
                     "seq_len": 256, "lengths": lengths})
    written = b.write()
    points = tuple(length_cost.LengthPoint(4, w, s) for w, s in timed)
    length_cost.write(written, length_cost.LengthCost(points, "cpu", 1, "GPT2LMHeadModel", None, draws=draws))
    return _padding(build_report(load_recording(written)))


def test_a_timed_pass_slower_than_the_trainings_own_batch_is_read_as_the_training_ran(tmp_path: Path) -> None:
    """The timing child's pass at the width that ran, three times the training's own batch there (a
    disturbed first pass): the prediction divides by the training's batch, not by the outlier."""

    def report(at_256: float, draws: int = 1) -> dict[str, Any]:
        return _timed_report(tmp_path / f"{at_256}-{draws}", ((256, at_256), (64, 0.08), (32, 0.04)), draws)

    as_ran = report(0.5)  # the training's own batch: 0.5 s of compute a step
    disturbed = report(1.5)
    assert as_ran["data"]["workload_basis"] == disturbed["data"]["workload_basis"] == "measured"
    assert disturbed["data"]["compute_after_ratio"] == as_ran["data"]["compute_after_ratio"]
    assert disturbed["predicted_speedup"] == as_ran["predicted_speedup"]
    faster = report(0.4)  # a child faster than the training's hooked batch: its own figure stands
    assert faster["data"]["compute_after_ratio"] > as_ran["data"]["compute_after_ratio"]
    # the points the median of three processes' draws: the basis says so; where no pass was slower
    # than the training's own batch (nothing to bring down), the figures are the same
    one, medianed = report(0.45), report(0.45, draws=3)
    assert "(cpu, 1 thread; the median of 3 processes)" in str(medianed["evidence"])
    assert "median of" not in str(one["evidence"]) and medianed["predicted_speedup"] == one["predicted_speedup"]


def test_a_child_slower_than_the_training_at_every_width_keeps_its_own_curve(tmp_path: Path) -> None:
    """Three draws whose passes all ran 1.3x the training's (the child slower as a whole, not one
    disturbed pass: the draws' median outvotes that): every width is read on the training's scale,
    so the compute after is the child's own ratio, where lowering the width that ran alone read the
    narrow widths 1.3x slow against it (loop 10 of the proving ground: 0.165 where 0.126 held)."""

    def report(scale: float, draws: int) -> dict[str, Any]:
        timed = tuple((w, s * scale) for w, s in ((256, 0.5), (64, 0.08), (32, 0.04)))
        return _timed_report(tmp_path / f"{scale}-{draws}", timed, draws)

    as_ran = report(1.0, draws=3)  # the child's pass at 256 is the training's own batch there
    slower = report(1.3, draws=3)
    assert slower["data"]["workload_basis"] == "measured"
    assert slower["data"]["compute_after_ratio"] == pytest.approx(as_ran["data"]["compute_after_ratio"], rel=1e-3)
    assert slower["predicted_speedup"] == pytest.approx(as_ran["predicted_speedup"], rel=1e-3)
    one_draw = report(1.3, draws=1)  # nothing outvoted a disturbed first pass: that pass alone comes down
    assert one_draw["data"]["compute_after_ratio"] > as_ran["data"]["compute_after_ratio"]


def _tokenizing(tmp_path: Path, cuda: bool) -> dict[str, Any]:
    """The golden cpu_tokenizing loop, on a CPU or on CUDA: its tokenization finding."""
    report = build_report(load_recording(_cpu_run(tmp_path, cuda=cuda).write()))
    return next(f for f in report["findings"] if f["rule"] == "tokenization_in_loop")


def test_the_tokenizing_fix_pads_as_the_padding_fix_does(tmp_path: Path) -> None:
    """One knob, one spelling: the pre-tokenizing snippet's collator rounds as the padding fix would."""
    cpu, gpu = _tokenizing(tmp_path / "cpu", cuda=False), _tokenizing(tmp_path / "gpu", cuda=True)
    assert cpu["fix"]["snippet"].endswith("DataCollatorWithPadding(tokenizer)")
    assert "DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64)" in gpu["fix"]["snippet"]
