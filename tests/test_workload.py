"""The one workload model: FLOPs by hand, the fit, the model's shape from its parameters, and the
padding fix's one value and one prediction in ``run`` and ``try`` on one recording."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from torch import nn

from gpudoctor.analysis import analyze, workload
from gpudoctor.analysis.workload import Shape
from gpudoctor.hooks.torch_hooks import model_shape
from gpudoctor.recording.store import load_recording
from gpudoctor.replay import costmodel
from gpudoctor.rules import account, knobs, run_rules
from gpudoctor.tryfix import plan as planning
from tests.conftest import within


def test_flops_per_token_is_palm_by_hand() -> None:
    shape = Shape(params=1000, n_layers=2, hidden=8)
    # 6N + 12·L·d·seq = 6000 + 12·2·8·10
    assert workload.flops_per_token(shape, 10) == 6000 + 1920
    # LoRA: 4N (no weight gradients) + the same attention
    assert workload.flops_per_token(shape, 10, lora=True) == 4000 + 1920
    # gradient checkpointing: one more forward, 2N + 4·L·d·seq
    assert workload.flops_per_token(shape, 10, recompute=True) == pytest.approx(6000 + 1920 + 2000 + 640)
    # no attention term for an attention-free model
    assert workload.flops_per_token(Shape(1000, 2, 8, attention=False), 10) == 6000
    # a step: 2 rows of 10 and 1 row of 5
    assert workload.step_flops(shape, [(2, 10), (1, 5)]) == 2 * 10 * 7920 + 5 * (6000 + 12 * 2 * 8 * 5)


def test_replay_costmodel_reads_the_same_formula() -> None:
    w = _costmodel_workload(params=1000.0, n_layers=2, hidden_size=8, flops_k=4.0, recompute=True)
    assert costmodel.flops_per_sample(10, w) == pytest.approx(
        workload.row_flops(Shape(1000, 2, 8), 10, lora=True, recompute=True))


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)


class _Tiny(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(128, d)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: multiplied once per token, counted once


def test_shape_of_a_plain_module_from_its_parameters() -> None:
    shape = model_shape(_Tiny(vocab=50, d=16, layers=2))
    assert shape is not None
    per_block = 3 * 16 * 16 + 16 * 16 + 4 * 16 * 16 + 4 * 16 * 16
    assert shape == {"matmul_params": 2 * per_block + 50 * 16, "n_layers": 2, "hidden": 16, "attention": True}
    parsed = workload.shape_from_model_event({"config": {}, "params": 1, "shape": shape})
    assert parsed == Shape(2 * per_block + 800, 2, 16, True, "the model's parameter shapes")


def test_shape_from_a_recorded_config() -> None:
    event = {"config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_positions": 1024}, "params": 300_000}
    assert workload.shape_from_model_event(event) == Shape(300_000 - 1024 * 64, 2, 64, True,
                                                          "the recorded model config")
    assert workload.shape_from_model_event({"config": {}, "params": 10}) is None


def test_fit_recovers_per_token_and_per_token_squared_costs() -> None:
    rng = random.Random(0)
    steps = []
    for _ in range(30):
        rows, width = 4, rng.choice([64, 128, 256, 512])
        steps.append(([(rows, width)], 0.01 + 3e-6 * rows * width + 2e-8 * rows * width * width))
    fit = workload.fit(None, steps)
    assert fit is not None and fit.basis == "fitted" and fit.samples == 30
    assert fit.per_token_s == pytest.approx(3e-6, rel=1e-6)
    assert fit.per_token2_s == pytest.approx(2e-8, rel=1e-6)
    # the per-step constant (optimizer) is not a batch cost
    assert fit.cost_s([(4, 128)]) == pytest.approx(3e-6 * 512 + 2e-8 * 4 * 128 * 128)


def test_fit_on_one_width_uses_flops_and_the_measured_seconds_per_flop() -> None:
    shape = Shape(1000, 2, 8)
    steps = [([(4, 100)], 0.5)] * 5
    fit = workload.fit(shape, steps)
    assert fit is not None and fit.basis == "flops"
    assert fit.s_per_flop == pytest.approx(2.5 / (5 * 4 * 100 * (6000 + 12 * 2 * 8 * 100)))
    assert fit.cost_s([(4, 100)]) == pytest.approx(0.5)  # the run's own step, reproduced
    # a shorter max_length: the ratio is the formula's, linear plus quadratic
    ratio = workload.cost_ratio(fit, [(4, 100)], [(4, 25)])
    assert ratio == pytest.approx(25 * (6000 + 12 * 2 * 8 * 25) / (100 * (6000 + 12 * 2 * 8 * 100)))
    assert workload.fit(None, steps) is None  # no shape, one width: nothing to fit


def test_packing_and_batch_size_change_the_work_per_step() -> None:
    # 3 rows of 9, 19 and 29 real tokens + 1 separator each = 60 tokens: 2 rows of 32
    assert workload.packed_rows([9, 19, 29], 32) == [(2, 32)]
    assert workload.batch_size_rows([(4, 128), (3, 64)], 2.0) == [(8, 128), (6, 64)]
    fit = workload.Fit(1.0, 0.0, None, "flops", 1)  # token-linear cost: packing saves the pad share
    assert workload.cost_ratio(fit, [(3, 32)], workload.packed_rows([9, 19, 29], 32)) == pytest.approx(64 / 96)


def test_padding_value_and_prediction_are_one_in_run_and_try(probe_run) -> None:
    run = probe_run("narrow_padding", "--steps", "5", "--max-length", "512", "--examples", "64")
    assert run.returncode == 0, run.stderr[-2000:]
    finding = run.finding("padding_waste")
    data = finding["data"]
    # one value and one prediction: no range, since the model was timed at several widths
    assert finding["predicted_speedup_range"] is None
    assert data["rows_after"] == "max_length"
    new_max = data["new_max_length"]
    assert finding["fix"]["config"]["max_length"] == new_max
    assert f"--max-length {new_max}" in data["command_line"]
    # every batch had one width: the run timed a GPT-2 of the recorded shape (hidden 64, 2
    # layers; the probe's own class is never rebuilt) at 512 and narrower widths, on this CPU
    a = analyze(load_recording(run.folder))
    measured = a.rec.length_cost
    assert measured is not None and measured.stand_in and measured.model == "TinyCausalLM"
    assert data["workload_basis"] == "measured" and "standing in for TinyCausalLM" in finding["evidence"] and "own fixed cost" in finding["evidence"]
    assert {q.width for q in measured.points} >= {512, 256, 128} and all(q.rows == 4 for q in measured.points)
    timed = workload.fit_measured([(q.rows, q.width, q.seconds) for q in measured.points])
    assert timed is not None and timed.basis == "measured"
    # the stand-in's cost per token and token², the probe's own fixed cost per batch: its batch at
    # 512 (its compute per batch, less the optimizer's share) less the stand-in's width part there
    p = a.primary
    assert p is not None and 0 < p.optimizer_s < p.seconds("compute")
    fixed = p.optimizer_s / p.seconds("compute")
    own = p.seconds("compute") / len(p.batches) * (1 - fixed)
    c = max(0.0, own - (timed.batch_s(4, 512) - timed.per_batch_s))
    fit = replace(timed, per_batch_s=c)
    ratio = fit.batch_s(4, new_max) / fit.batch_s(4, 512)
    assert data["compute_after_ratio"] == pytest.approx(fixed + (1 - fixed) * ratio, abs=1e-4)
    # the cap says what it cuts, from the rows the batches recorded (#40 item 7)
    lengths = [int(x) for q in a.procs for b in q.batches for x in b.get("lengths") or []]
    cut = sum(x > new_max for x in lengths)
    assert (data["rows_seen"], data["rows_truncated"], data["longest_row"]) == (len(lengths), cut, max(lengths))
    assert f"of the {len(lengths)} rows seen" in finding["fix"]["summary"]
    # try on the same recording sets the same value and predicts the finding's own figure
    plan = planning.make_plan(run.report, a, None, {})
    assert plan is not None and plan.rule == "padding_waste"
    assert plan.spec()["tokenizer"]["max_length"] == new_max
    predicted = knobs.predict(a, run_rules(a)[0], "padding_waste", plan.workers)
    assert predicted.up_to is None and predicted.speedup == pytest.approx(finding["predicted_speedup"], abs=1e-3)
    # the one speedup: steady-state steps/s, settled on the training loop's seconds alone
    shares = a.breakdown()
    loop = sum(shares.get(b) or 0.0 for b in account.LOOP_BUCKETS)
    compute = (shares.get("compute") or 0.0) / loop
    assert predicted.speedup == pytest.approx(account.speedup(compute * (1 - data["compute_after_ratio"])), rel=2e-3)
    assert finding["whole_run_speedup"] < finding["predicted_speedup"]  # startup does not shrink


def test_a_measured_fit_keeps_its_fixed_cost_per_batch() -> None:
    # 2 ms a pass at any width (launches, Python) + 1 µs a token + 1 ns a token² of row length
    points = [(4, w, 0.002 + 4 * w * (1e-6 + 1e-9 * w)) for w in (64, 128, 256, 512, 1024)]
    fit = workload.fit_measured(points)
    assert fit is not None and fit.basis == "measured"
    assert (fit.per_batch_s, fit.per_token_s, fit.per_token2_s) == pytest.approx((0.002, 1e-6, 1e-9), rel=1e-6)
    # FLOPs-like ratios without the fixed part would promise more than the passes give
    assert workload.cost_ratio(fit, [(4, 1024)], [(4, 64)]) == pytest.approx(points[0][2] / points[-1][2])
    assert workload.fit_measured([(4, 64, 0.002), (4, 128, 0.002)]) is None  # no width-dependent part


def test_a_measured_fit_reads_every_timed_width_as_timed() -> None:
    # a CPU's pass is no quadratic in width: these are one loop's GPT-2 passes (16 rows) timed on this
    # VM, where the quadratic through them read 560 11% under the 1.82 s a pass took there
    points = [(16, 1024, 5.25), (16, 696, 2.50), (16, 640, 2.09), (16, 256, 0.52)]
    fit = workload.fit_measured(points)
    assert fit is not None and len(fit.anchors) == 4
    for rows, width, seconds in points:
        assert fit.batch_s(rows, width) == pytest.approx(seconds, rel=1e-9)
    # between two timed widths the reading lies between theirs; twice the rows, twice the width part
    assert points[3][2] < fit.batch_s(16, 560) < points[2][2]
    assert fit.batch_s(32, 640) - fit.per_batch_s == pytest.approx(2 * (2.09 - fit.per_batch_s))
    # beyond the timed widths the nearest one's scale holds: the curve's shape, through that point
    inner = workload.Fit(fit.per_token_s, fit.per_token2_s, None, "measured", 4, per_batch_s=fit.per_batch_s)
    k = (0.52 - fit.per_batch_s) / (inner.batch_s(16, 256) - fit.per_batch_s)
    assert fit.batch_s(16, 128) - fit.per_batch_s == pytest.approx(k * (inner.batch_s(16, 128) - fit.per_batch_s))


def test_fsync_after_a_save_is_part_of_the_save(probe_run) -> None:
    run = probe_run("fsync_checkpoints", "--steps", "12", "--n-embd", "128")
    assert run.returncode == 0, run.stderr[-2000:]
    finding = run.finding("checkpoint_overhead")
    assert finding["data"]["saves"] == run.truth["checkpoints"] == 12
    # the acceptance bar of every probe (test_probes): the share of wall within 25% or 5 points
    assert within(run.report["breakdown"]["checkpoint"], run.truth["checkpoint_share"]), (
        run.report["breakdown"]["checkpoint"], run.truth["checkpoint_share"])


def _costmodel_workload(**kw: float) -> costmodel.Workload:
    from gpudoctor.common.hardware import GpuSpec

    base = dict(params=1.0, trainable_params=1.0, n_layers=1, hidden_size=1, flops_k=6.0, attention=True,
                recompute=False, examples=1, epochs=1.0, max_steps=None, batch_size=1, accumulation=1, gpus=1,
                cores_per_rank=1, raw_lengths=(), loader_s_per_sample=0.0, loop_s_per_sample=0.0,
                pretokenized_s_per_sample=0.0, format_s_per_example=0.0, tokenize_s_per_example=0.0,
                cpu_speed_factor=1.0, checkpoint_bytes_per_param=0.0, checkpoint_write_gb_s=1.0, mfu=0.4,
                gpu=GpuSpec("t", "test", None, None, None, 1.0, 1.0, 1.0, 0.0, "test", "2026"), price_per_gpu_hour=0.0)
    base.update(kw)
    return costmodel.Workload(**base)  # type: ignore[arg-type]


def test_a_cap_below_the_longest_row_says_what_it_truncates() -> None:
    """A max_length from the p99 cuts the rows above it: the fix says how many of the rows seen."""
    import dataclasses

    from gpudoctor.rules.batches import PaddingGain, PadFigures, _cap_words

    gain = PaddingGain(0.5, None, "flops", "max_length", None)
    fig = PadFigures(0.6, 50, 300, 1024, 2048, 64, 100_000, 40_000, 1024, gain, False, 0.5,
                     rows_seen=200, rows_cut=3, longest_row=1481)
    words = _cap_words(fig)
    assert "truncates 1.5% of the 200 rows seen (3, the longest 1481 tokens, cut to 1024)" in words
    assert "keep max_length at 1481 or more to truncate none" in words
    whole = dataclasses.replace(fig, rows_cut=0, longest_row=1000)
    assert _cap_words(whole) == ": it truncates none of the 200 rows seen, the longest 1000 tokens"
    assert _cap_words(dataclasses.replace(fig, rows_seen=0)) == ""
