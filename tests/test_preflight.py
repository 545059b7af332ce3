"""Preflight arithmetic against numbers computed by hand (in the comments)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpudoctor.common.errors import UserError
from gpudoctor.replay import costmodel, gpus
from gpudoctor.replay.config import load_config_text
from gpudoctor.replay.preflight import predict, workload
from gpudoctor.rules import values

# A 1B-parameter decoder, 16 layers x 2048 wide, on one H100 SXM (bf16 peak 989.4
# TFLOP/s, 3350 GB/s), MFU 0.4, batch 8, no accumulation, 8000 examples => 1000 steps.
BASE = """
dataset: {kind: synthetic, count: 8000}
max_length: 1024
padding: max_length
model: {arch: llama, params_b: 1.0, n_layers: 16, hidden_size: 2048}
training:
  per_device_train_batch_size: 8
  dataloader_num_workers: 4
  bf16: true
hardware: {target: h100-sxm, gpus: 1, price_per_gpu_hour: 3.0, cpu_cores: 16, mfu: 0.4}
full_run: {examples: 8000}
"""

# flops/token = 6*1e9 + 12*16*2048*1024 = 6,402,653,184
# flops/sample (1024 tokens) = 6.556316860416e12; per micro-batch of 8 = 5.2450534883328e13
# seconds = 5.2450534883328e13 / (989.4e12 * 0.4 = 3.9576e14) = 0.132531167584718
COMPUTE_MICRO_S = 0.132531167584718
# AdamW: 1e9 params * 28 bytes / (3350e9 B/s * 0.7) = 0.011940298507462687 s
OPTIMIZER_S = 0.011940298507462687


def measure(
    lengths: list[int] | None = None, loader_s: float = 0.0, **extra: Any
) -> dict[str, Any]:
    return {
        "tokens": {"raw_lengths_sample": lengths or [1024] * 100},
        "pipeline": {
            "loader_s_per_sample": loader_s,
            "loop_s_per_sample": 0.0,
            "pretokenized_s_per_sample": loader_s / 10,
        },
        "startup_work": extra.get("startup_work", {"examples": 0}),
        "checkpoint": {"bytes_per_param": 12.0},
        "dataset_rows_total": 8000,
    }


def config(extra: str = "") -> Any:
    return load_config_text(BASE + extra)


def test_step_time_from_flops_matches_the_hand_computation() -> None:
    p = predict(config(), measure())
    before = p["before"]
    assert before["flops_per_sample"] == pytest.approx(6.556316860416e12)
    assert before["optimizer_steps"] == 1000
    assert before["step_s"] == pytest.approx(COMPUTE_MICRO_S + OPTIMIZER_S)  # 0.14447 s
    assert before["wall_h"] * 3600 == pytest.approx(144.4714660921807)
    assert before["cost_usd"] == pytest.approx(144.4714660921807 / 3600 * 3.0)
    assert before["gpu_busy_fraction"] == pytest.approx(1.0)
    assert p["fixes"] == [] and p["speedup"] == pytest.approx(1.0)


def test_gradient_accumulation_changes_only_the_optimizer_share() -> None:
    # accumulation 4: 250 optimizer steps of 4 micro-batches each
    cfg = load_config_text(
        BASE.replace("bf16: true", "bf16: true\n  gradient_accumulation_steps: 4")
    )
    before = predict(cfg, measure())["before"]
    assert before["optimizer_steps"] == 250
    assert before["wall_h"] * 3600 == pytest.approx(250 * (4 * COMPUTE_MICRO_S + OPTIMIZER_S))


def test_lora_counts_4n_per_token() -> None:
    # 4*1e9 + 402,653,184 = 4,402,653,184 flops/token
    cfg = load_config_text(BASE.replace("hidden_size: 2048}", "hidden_size: 2048, method: lora}"))
    p = predict(cfg, measure())
    assert p["before"]["flops_per_sample"] == pytest.approx(1024 * 4_402_653_184)


def test_gradient_checkpointing_adds_one_forward_pass() -> None:
    # + 2*1e9 + 4*16*2048*1024 = 2,134,217,728 per token on top of 6,402,653,184
    cfg = load_config_text(BASE.replace("bf16: true", "bf16: true\n  gradient_checkpointing: true"))
    flops = predict(cfg, measure())["before"]["flops_per_sample"]
    assert flops == pytest.approx(1024 * (6_402_653_184 + 2_134_217_728))


def test_serial_input_pipeline_adds_to_every_step() -> None:
    # workers=0, 10 ms/sample measured: 8 samples = 0.08 s serial with 0.13253 s of compute
    cfg = load_config_text(BASE.replace("dataloader_num_workers: 4", "dataloader_num_workers: 0"))
    before = predict(cfg, measure(loader_s=0.010))["before"]
    step = COMPUTE_MICRO_S + 0.08 + OPTIMIZER_S
    assert before["step_s"] == pytest.approx(step)
    assert before["data_stall_share"] == pytest.approx(0.08 / step)  # 35.6%
    assert before["gpu_busy_fraction"] == pytest.approx((COMPUTE_MICRO_S + OPTIMIZER_S) / step)


def test_stall_when_worker_capacity_is_below_demand() -> None:
    # 4 workers at 80 ms/sample: a batch of 8 every 8*0.08/4 = 0.16 s > 0.13253 s compute
    before = predict(config(), measure(loader_s=0.080))["before"]
    wait = 0.16 - COMPUTE_MICRO_S
    assert before["data_wait_s_per_step"] == pytest.approx(wait)
    assert before["data_stall_share"] == pytest.approx(wait / (0.16 + OPTIMIZER_S))


def test_workers_are_capped_by_the_target_cores() -> None:
    # 16 workers on 4 cores behave like 4
    cfg = load_config_text(
        BASE.replace("dataloader_num_workers: 4", "dataloader_num_workers: 16").replace(
            "cpu_cores: 16", "cpu_cores: 4"
        )
    )
    assert predict(cfg, measure(loader_s=0.080))["before"]["effective_workers"] == 4


def test_stall_fix_adds_workers_or_pretokenizes() -> None:
    cfg = load_config_text(BASE.replace("dataloader_num_workers: 4", "dataloader_num_workers: 0"))
    p = predict(cfg, measure(loader_s=0.010))
    fix = next(f for f in p["fixes"] if "dataloader_num_workers" in f["config"])
    # demand: 1.25 * 8*0.010 / 0.13253 = 0.75 -> 1 worker, as the rules' workers_needed says
    assert fix["config"]["dataloader_num_workers"] == 1 == values.workers_needed(0.08, COMPUTE_MICRO_S)
    assert p["after"]["data_stall_share"] == pytest.approx(0.0)
    assert p["speedup"] == pytest.approx(
        (COMPUTE_MICRO_S + 0.08 + OPTIMIZER_S) / (COMPUTE_MICRO_S + OPTIMIZER_S)
    )


def test_padding_fix_right_sizes_max_length_to_p99_rounded_to_64() -> None:
    # every example is 500 tokens, padded to 2048: p99 500 -> 512
    cfg = load_config_text(BASE.replace("max_length: 1024", "max_length: 2048"))
    p = predict(cfg, measure([500] * 200))
    assert p["before"]["pad_fraction"] == pytest.approx(1 - 500 / 2048)
    assert p["fixes"][0]["rule"] == "padding_waste" and p["fixes"][0]["config"] == {
        "max_length": 512
    }
    # 2048: 8*2048*(6e9 + 12*16*2048*2048)/3.9576e14 = 0.281731705 s; 512: 0.064181913 s
    assert p["after"]["step_s"] == pytest.approx(0.06418191257537902 + OPTIMIZER_S)
    assert p["speedup"] == pytest.approx(
        (0.28173170490527594 + OPTIMIZER_S) / (0.06418191257537902 + OPTIMIZER_S)
    )


TEMPLATED = "text: {template: 'Q: {q} A: {a}'}\n"


def test_padding_fix_sizes_max_length_with_the_rules_functions() -> None:
    # lengths 1..1481: p50 741 -> pad multiple 64; p99 (nearest rank) 1466 -> 1472 <= 2048
    lengths = list(range(1, 1482))
    cfg = load_config_text(BASE.replace("max_length: 1024", "max_length: 2048") + TEMPLATED)
    fix = next(f for f in predict(cfg, measure(lengths))["fixes"] if f["rule"] == "padding_waste")
    assert fix["config"]["max_length"] == 1472 == values.max_length_for(
        values.percentile(lengths, 99), 2048, multiple=values.pad_multiple_for(741)
    )
    assert fix["config"]["pad_to_multiple_of"] == 64 and fix["config"]["padding"] == "longest"


def test_padding_fix_never_lengthens_max_length() -> None:
    cfg = load_config_text(BASE + TEMPLATED)
    fixes = predict(cfg, measure([5000] * 10))["fixes"]
    assert all("max_length" not in f["config"] for f in fixes)


def test_recorded_lengths_size_the_padding_fix_as_the_finding_does() -> None:
    # seed 002's replay recorded p50 634 / p99 1335 over 17 batches, the finding said 1344;
    # the length sample alone (p99 1466) would say 1472. One report, one value: 1344.
    recorded = {"p50_length": 634, "p99_length": 1335, "max_length": 2048, "batches_seen": 17}
    cfg = load_config_text(BASE.replace("max_length: 1024", "max_length: 2048") + TEMPLATED)
    p = predict(cfg, measure(list(range(1, 1482))), recorded_padding=recorded)
    fix = next(f for f in p["fixes"] if f["rule"] == "padding_waste")
    assert fix["config"]["max_length"] == 1344 == values.max_length_for(1335, 2048, multiple=64)
    assert "recorded lengths over 17 recorded batches" in fix["summary"]
    assert p["after"]["max_length"] == 1344


def test_recorded_lengths_cut_at_a_shorter_replay_max_length_are_not_used() -> None:
    # seed 004 replays at 1K what runs at 16K: rows recorded at 1024 say nothing of the 16K run
    recorded = {"p50_length": 1024, "p99_length": 1024, "max_length": 1024, "batches_seen": 20}
    cfg = load_config_text(
        BASE.replace("{examples: 8000}", "{examples: 8000, max_length: 2048}") + TEMPLATED
    )
    assert cfg.max_length == 1024 and cfg.full_run.max_length == 2048
    p = predict(cfg, measure(list(range(1, 1482))), recorded_padding=recorded)
    fix = next(f for f in p["fixes"] if f["rule"] == "padding_waste")
    assert fix["config"]["max_length"] == 1472 and "1,481 sampled lengths" in fix["summary"]


def test_pad_to_longest_rounds_each_batch_up_to_the_multiple() -> None:
    # batches of 8 rows of 100 tokens pad to 128 with multiple 64, never past max_length
    facts = workload(config(), measure([100] * 64), gpus.lookup("h100"), [])
    plan = costmodel.Plan(1024, "longest", 4, "bf16", None, "configured", False, False, 64)
    assert costmodel.tokens(plan, facts)["padded"] == 128
    capped = costmodel.Plan(120, "longest", 4, "bf16", None, "configured", False, False, 64)
    assert costmodel.tokens(capped, facts)["padded"] == 120


def test_packing_counts_chunks_not_examples() -> None:
    # 8000 examples of 100 tokens (+1 EOS) packed into 1024: ceil(8000*101/1024) = 790 chunks
    plan = costmodel.Plan(1024, "packing", 4, "bf16", None, "pretokenized", False, False)
    facts = workload(config(), measure([100] * 50), gpus.lookup("h100"), [])
    assert costmodel.tokens(plan, facts)["samples_per_epoch"] == math.ceil(8000 * 101 / 1024) == 790


def test_formatting_at_startup_costs_examples_over_the_measured_rate() -> None:
    # seed 000: 2,468,761 examples at 20,000/s = 123.4 s of idle GPUs before the first step
    cfg = load_config_text(
        BASE.replace("full_run: {examples: 8000}", "full_run: {examples: 2468761}")
        + "text: {template: 'Q: {q} A: {a}', format_at: startup}\n"
    )
    p = predict(cfg, measure(startup_work={"examples": 4000, "format_s": 0.2}))
    assert p["before"]["startup_s"] == pytest.approx(2468761 / 20000)
    assert p["after"]["startup_s"] == 0
    assert any(
        f["rule"] == "startup_idle" and f["config"] == {"format_at": "ahead"} for f in p["fixes"]
    )


def test_checkpoint_fix_brings_saving_under_two_percent() -> None:
    # 80,000 examples: 10,000 steps x 0.14447 s = 1444.7 s of training; save every 100 ->
    # 100 saves of 1e9*12 B at 1 GB/s = 12 s each = 1200 s. 2% of 1444.7 s = 28.9 s allows
    # 2 saves -> save_steps 5000 -> 24 s = 1.6% of the run.
    cfg = load_config_text(
        BASE.replace("bf16: true", "bf16: true\n  save_steps: 100").replace(
            "examples: 8000", "examples: 80000"
        )
    )
    p = predict(cfg, measure())
    assert p["before"]["checkpoint_count"] == 100
    assert p["before"]["checkpoint_s"] == pytest.approx(1200.0)
    fix = p["fixes"][-1]
    assert fix["rule"] == "checkpoint_overhead" and fix["config"] == {"save_steps": 5000}
    assert p["after"]["checkpoint_s"] == pytest.approx(24.0)
    assert p["after"]["breakdown"]["checkpoint"] <= 0.02


def test_fp32_without_tf32_uses_the_non_tensor_core_peak_and_fix_is_bf16() -> None:
    cfg = load_config_text(BASE.replace("bf16: true", "bf16: false\n  tf32: false"))
    p = predict(cfg, measure())
    assert p["before"]["peak_tflops"] == 66.9
    assert p["fixes"][0]["rule"] == "no_mixed_precision" and p["fixes"][0]["config"]["bf16"] is True
    assert p["after"]["peak_tflops"] == 989.4


def test_v100_gets_fp16_not_bf16() -> None:
    cfg = load_config_text(BASE.replace("bf16: true", "bf16: false").replace("h100-sxm", "v100"))
    fix = predict(cfg, measure())["fixes"][0]
    assert fix["config"] == {"fp16": True}


def test_cli_target_overrides_the_config_and_unknown_lists_known() -> None:
    p = predict(config(), measure(), target="a100-80gb", mfu=0.5)
    assert p["target"]["key"] == "a100-80gb" and p["assumptions"]["mfu"] == 0.5
    with pytest.raises(UserError, match="known: a100-40gb, a100-80gb, h100-sxm"):
        predict(config(), measure(), target="tpu-v5")


def test_memory_note_when_full_finetune_state_does_not_fit() -> None:
    # 8B full fine-tune: 8e9 * 16 B = 128 GB > 80 GB
    cfg = load_config_text(BASE.replace("params_b: 1.0", "params_b: 8.0"))
    notes = predict(cfg, measure())["notes"]
    assert any("~128 GB per GPU" in n for n in notes)


def test_multi_gpu_splits_the_steps_and_multiplies_the_price() -> None:
    cfg = load_config_text(BASE.replace("gpus: 1", "gpus: 4"))
    p = predict(cfg, measure())["before"]
    assert p["optimizer_steps"] == 250 and p["global_batch"] == 32
    assert p["cost_usd"] == pytest.approx(250 * (COMPUTE_MICRO_S + OPTIMIZER_S) / 3600 * 4 * 3.0)


def test_a_fine_config_gets_no_invented_waste() -> None:
    cfg = load_config_text(BASE.replace("padding: max_length", "padding: longest"))
    p = predict(cfg, measure([900, 1000, 1024] * 30, loader_s=0.001))
    assert p["fixes"] == [] and p["after"] == p["before"]
    assert p["before"]["data_stall_share"] == 0 and p["before"]["breakdown"]["checkpoint"] == 0
