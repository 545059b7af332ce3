"""The arithmetic of a preflight prediction: pure functions, no I/O, no torch.

Model FLOPs per token: :mod:`gpudoctor.analysis.workload` (PaLM 6N + attention, LoRA,
gradient checkpointing), the one workload model of rules, ``try``, ``replay`` and ``sweep``. Seconds are
FLOPs / (datasheet peak for the precision x assumed MFU). The optimizer step
streams 28 bytes per trainable parameter (fp32 AdamW: read p, g, m, v; write p,
m, v) at ``BANDWIDTH_EFFICIENCY`` of the datasheet memory bandwidth (both figures live in
:mod:`gpudoctor.analysis.workload`, which the analysis shares).

The input pipeline is the worker's measured seconds per sample on one process
(divided by ``cpu_speed_factor``), spread over ``min(workers, cores per GPU)``
processes; with ``num_workers=0`` it runs serially with the step.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import workload
from gpudoctor.common.hardware import GpuSpec

STATE_BYTES_PER_PARAM = 16  # weights + grads + AdamW moments, mixed precision or fp32


@dataclass(frozen=True)
class Plan:
    """The knobs a fix can turn."""

    max_length: int
    padding: str  # max_length | longest | packing
    workers: int
    precision: str  # bf16 | fp16 | tf32 | fp32
    save_steps: int | None
    input_side: str  # configured | in_loader | pretokenized
    startup_format: bool
    startup_tokenize: bool
    pad_multiple: int = 1  # padding to the longest row rounds up to this (pad_to_multiple_of)


@dataclass(frozen=True)
class Workload:
    """Facts of the run no fix changes (sizes, measured rates, the target)."""

    params: float
    trainable_params: float
    n_layers: int
    hidden_size: int
    flops_k: float
    attention: bool
    recompute: bool
    examples: int
    epochs: float
    max_steps: int | None
    batch_size: int
    accumulation: int
    gpus: int
    cores_per_rank: int
    raw_lengths: tuple[int, ...]
    loader_s_per_sample: float
    loop_s_per_sample: float
    pretokenized_s_per_sample: float
    format_s_per_example: float
    tokenize_s_per_example: float
    cpu_speed_factor: float
    checkpoint_bytes_per_param: float
    checkpoint_write_gb_s: float
    mfu: float
    gpu: GpuSpec
    price_per_gpu_hour: float
    # The lengths the max_length and pad-multiple fixes are sized from (values.py), and where
    # they come from: the replay's recording when there is one, else the length sample.
    length_p50: int | None = None
    length_p99: int | None = None
    length_basis: str = "the sampled lengths"


def padded_lengths(
    lengths: list[float], batch_size: int, seed: int = 0, multiple: int = 1, cap: float = math.inf
) -> list[float]:
    """Each sample's padded length when every random batch pads to its longest row,
    rounded up to ``multiple`` but never past ``cap`` (max_length)."""
    order = list(lengths)
    random.Random(seed).shuffle(order)
    out: list[float] = []
    for i in range(0, len(order), batch_size):
        chunk = order[i : i + batch_size]
        out.extend([min(cap, float(multiple * math.ceil(max(chunk) / multiple)))] * len(chunk))
    return out


def longest_padded_mean(
    lengths: list[float], batch_size: int, seed: int = 0, multiple: int = 1, cap: float = math.inf
) -> float:
    """Mean padded length per sample with pad-to-longest over random batches."""
    return statistics.fmean(padded_lengths(lengths, batch_size, seed, multiple, cap))


def tokens(plan: Plan, w: Workload) -> dict[str, float]:
    """Padded and real tokens per sample, and samples per epoch (packing makes chunks)."""
    raw = list(w.raw_lengths) or [plan.max_length]
    if plan.padding == "packing":
        per_example = statistics.fmean(raw) + 1  # + EOS separator
        samples = math.ceil(w.examples * per_example / plan.max_length)
        return {"padded": plan.max_length, "nonpad": plan.max_length, "samples_per_epoch": samples}
    nonpad = [min(x, plan.max_length) for x in raw]
    if plan.padding == "max_length":
        padded = float(plan.max_length)
    else:
        padded = longest_padded_mean(
            [float(x) for x in nonpad], w.batch_size, multiple=plan.pad_multiple, cap=plan.max_length
        )
    return {"padded": padded, "nonpad": statistics.fmean(nonpad), "samples_per_epoch": w.examples}


def flops_per_sample(padded: float, w: Workload) -> float:
    """Training FLOPs for one sample (:func:`gpudoctor.analysis.workload.row_flops`)."""
    shape = workload.Shape(w.params, w.n_layers, w.hidden_size, w.attention)
    return workload.row_flops(shape, padded, lora=w.flops_k < 6, recompute=w.recompute)


def input_costs(plan: Plan, w: Workload) -> tuple[float, float]:
    """(DataLoader seconds per sample, loop seconds per sample) on the target's CPU."""
    if plan.input_side == "pretokenized":
        loader, loop = w.pretokenized_s_per_sample, 0.0
    elif plan.input_side == "in_loader":
        loader, loop = w.loader_s_per_sample + w.loop_s_per_sample, 0.0
    else:
        loader, loop = w.loader_s_per_sample, w.loop_s_per_sample
    return loader / w.cpu_speed_factor, loop / w.cpu_speed_factor


def micro_step(plan: Plan, w: Workload, compute_s: float) -> tuple[float, float]:
    """(wall seconds, data-wait seconds) of one micro-batch on one GPU."""
    loader, loop = input_costs(plan, w)
    produce = w.batch_size * loader
    if plan.workers == 0:
        wall = compute_s + produce + w.batch_size * loop
    else:
        parallel = min(plan.workers, w.cores_per_rank)
        wall = max(compute_s, produce / parallel) + w.batch_size * loop
    return wall, wall - compute_s


def simulate(plan: Plan, w: Workload) -> dict[str, Any]:
    """Every figure of the whole run under ``plan``."""
    tok = tokens(plan, w)
    peak_tflops = w.gpu.peak_tflops(plan.precision)
    sample_s = flops_per_sample(tok["padded"], w) / (peak_tflops * 1e12 * w.mfu)
    compute_micro = w.batch_size * sample_s
    micro_wall, micro_wait = micro_step(plan, w, compute_micro)
    optimizer_s = (
        w.trainable_params
        * workload.ADAMW_BYTES_PER_PARAM
        / (w.gpu.bandwidth_gb_s * 1e9 * workload.BANDWIDTH_EFFICIENCY)
    )
    total_samples = tok["samples_per_epoch"] * w.epochs
    steps = w.max_steps or math.ceil(total_samples / (w.batch_size * w.accumulation * w.gpus))
    step_s = w.accumulation * micro_wall + optimizer_s
    train_s = steps * step_s
    startup_s = (
        w.examples
        * (
            w.format_s_per_example * plan.startup_format
            + w.tokenize_s_per_example * plan.startup_tokenize
        )
        / w.cpu_speed_factor
    )
    saves = steps // plan.save_steps if plan.save_steps else 0
    save_s = w.checkpoint_bytes_per_param * w.trainable_params / (w.checkpoint_write_gb_s * 1e9)
    wall_s = startup_s + train_s + saves * save_s
    compute_total = steps * (w.accumulation * compute_micro + optimizer_s)
    wait_total = steps * w.accumulation * micro_wait
    return {
        "max_length": plan.max_length,
        "padding": plan.padding,
        "precision": plan.precision,
        "peak_tflops": peak_tflops,
        "dataloader_num_workers": plan.workers,
        "effective_workers": min(plan.workers, w.cores_per_rank),
        "save_steps": plan.save_steps,
        "input_side": plan.input_side,
        "global_batch": w.batch_size * w.accumulation * w.gpus,
        "samples": math.ceil(total_samples),
        "optimizer_steps": steps,
        "tokens_per_sample_padded": tok["padded"],
        "tokens_per_sample_nonpad": tok["nonpad"],
        "pad_fraction": 1 - tok["nonpad"] / tok["padded"],
        "flops_per_sample": flops_per_sample(tok["padded"], w),
        "compute_s_per_step": w.accumulation * compute_micro + optimizer_s,
        "optimizer_s_per_step": optimizer_s,
        "data_wait_s_per_step": w.accumulation * micro_wait,
        "step_s": step_s,
        "startup_s": startup_s,
        "checkpoint_count": saves,
        "checkpoint_s_each": save_s,
        "checkpoint_s": saves * save_s,
        "train_s": train_s,
        "wall_h": wall_s / 3600,
        "tokens_per_s": total_samples * tok["nonpad"] / wall_s,
        "cost_usd": wall_s / 3600 * w.gpus * w.price_per_gpu_hour,
        "gpu_busy_fraction": compute_total / wall_s,
        "data_stall_share": wait_total / wall_s,
        "breakdown": {
            "startup": startup_s / wall_s,
            "data_wait": wait_total / wall_s,
            "compute": compute_total / wall_s,
            "checkpoint": saves * save_s / wall_s,
        },
        "memory_state_gb_per_gpu": state_gb(w),
    }


def state_gb(w: Workload) -> float:
    """Weights, gradients and AdamW state per GPU without sharding (activations excluded)."""
    frozen = w.params - w.trainable_params
    return (frozen * 2 + w.trainable_params * STATE_BYTES_PER_PARAM) / 1e9
