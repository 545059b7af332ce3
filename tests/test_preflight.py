"""Preflight arithmetic against numbers computed by hand (in the comments)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpudoctor.errors import UserError
from gpudoctor.replay import costmodel, gpus
from gpudoctor.replay.config import load_config_text
from gpudoctor.replay.preflight import predict, right_sized_length, workload

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
    # demand: 8*0.010 / 0.13253 * 1.25 = 0.75 -> at least 2 workers
    assert fix["config"]["dataloader_num_workers"] == 2
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


def test_right_sized_length_never_exceeds_max_length() -> None:
    assert right_sized_length(tuple(range(1, 1482)), 2048) == 1472  # p99 = 1467 -> 1472
    assert right_sized_length((5000,), 2048) == 2048


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
