"""Preflight: predict the full run on a target GPU, before and after the fixes.

``predict(config, measure)`` combines the config (sizes, settings, target) with
the worker's ``replay_measure.json`` (input pipeline seconds per sample on one
process, startup work per example, token lengths, checkpoint bytes per parameter)
through the pure arithmetic of :mod:`gpudoctor.replay.costmodel`. Every assumption
is returned next to the numbers it produced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpudoctor.analysis.workload import ADAMW_BYTES_PER_PARAM, BANDWIDTH_EFFICIENCY, infer_shape
from gpudoctor.common.errors import UserError
from gpudoctor.core.schema import Preflight, PreflightTarget
from gpudoctor.replay import costmodel, gpus
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.costmodel import Plan, Workload, simulate
from gpudoctor.replay.fixes import apply_fixes
from gpudoctor.rules import values

__all__ = ["predict", "workload", "plan_from_config", "apply_fixes"]

SCHEMA = "gpudoctor.preflight/1"
DEFAULT_CORES_PER_GPU = 8


def predict(
    config: ReplayConfig,
    measure: dict[str, Any],
    *,
    target: str | None = None,
    mfu: float | None = None,
    price_per_gpu_hour: float | None = None,
    gpus_count: int | None = None,
    recorded_padding: Mapping[str, Any] | None = None,
) -> Preflight:
    """The whole-run prediction on ``target`` (default ``hardware.target``), before and after fixes.

    ``recorded_padding`` is the replay report's ``padding`` section: when it has lengths,
    the padding fix is sized from them, as the report's ``padding_waste`` finding is, so
    one replay report shows one ``max_length`` and one pad multiple.
    """
    gpu = _target(config, target)
    notes: list[str] = []
    w = workload(
        config, measure, gpu, notes, mfu=mfu, price=price_per_gpu_hour, gpus_count=gpus_count,
        recorded_padding=recorded_padding,
    )
    before_plan = plan_from_config(config, w, notes)
    before = simulate(before_plan, w)
    after_plan, fixes = apply_fixes(before_plan, w, config)
    after = simulate(after_plan, w)
    notes.extend(_memory_notes(w))
    return {
        "schema": SCHEMA,
        "target": _target_section(gpu, w),
        "assumptions": _assumptions(w),
        "before": before,
        "after": after,
        "fixes": fixes,
        "speedup": before["wall_h"] / after["wall_h"],
        "saved_usd": before["cost_usd"] - after["cost_usd"],
        "notes": notes,
    }


def _target_section(gpu: gpus.GpuSpec, w: Workload) -> PreflightTarget:
    """The spec's fields in its order, at the price the prediction used, with the GPUs and cores."""
    return {"key": gpu.key, "name": gpu.name, "bf16_tflops": gpu.bf16_tflops, "fp16_tflops": gpu.fp16_tflops,
            "tf32_tflops": gpu.tf32_tflops, "fp32_tflops": gpu.fp32_tflops, "memory_gb": gpu.memory_gb,
            "bandwidth_gb_s": gpu.bandwidth_gb_s, "price_per_gpu_hour": w.price_per_gpu_hour,
            "source": gpu.source, "date": gpu.date, "price_source": gpu.price_source,
            "gpus": w.gpus, "cpu_cores": w.cores_per_rank * w.gpus}


def _target(config: ReplayConfig, target: str | None) -> gpus.GpuSpec:
    name = target or config.hardware.target
    if not name:
        raise UserError(
            f"no target GPU: pass --target (one of {', '.join(gpus.known_keys())}) or set hardware.target"
        )
    spec = config.hardware.gpu_spec
    return gpus.lookup(name, dataclasses.asdict(spec) if spec else None)


def workload(
    config: ReplayConfig,
    measure: dict[str, Any],
    gpu: gpus.GpuSpec,
    notes: list[str],
    *,
    mfu: float | None = None,
    price: float | None = None,
    gpus_count: int | None = None,
    recorded_padding: Mapping[str, Any] | None = None,
) -> Workload:
    """The fixed facts of the full run, from the config and the measurement."""
    hw, tr, full, model = config.hardware, config.training, config.full_run, config.model
    params, layers, hidden = _model_size(config, measure, notes)
    trainable = params * model.lora_fraction if model.method == "lora" else params
    n_gpus = gpus_count or hw.gpus
    cores = hw.cpu_cores or DEFAULT_CORES_PER_GPU * n_gpus
    if hw.cpu_cores is None:
        notes.append(
            f"hardware.cpu_cores not given: assumed {cores} ({DEFAULT_CORES_PER_GPU} per GPU)"
        )
    pipe = measure.get("pipeline") or {}
    if not pipe:
        notes.append(
            "no pipeline measurement (worker ran with --no-measure): input pipeline treated as free"
        )
    start = measure.get("startup_work") or {}
    ckpt = measure.get("checkpoint") or {}
    examples = full.examples or int(
        measure.get("dataset_rows_total") or measure.get("examples_replayed") or 1
    )
    max_steps = full.max_steps or (tr.max_steps if tr.max_steps > 0 else None)
    raw_lengths = tuple(
        int(x) for x in (measure.get("tokens") or {}).get("raw_lengths_sample", [])
    )
    # The replay's rows were cut at its own max_length: they stand for the full run's only
    # when the full run keeps that max_length (seed 004 replays 1K of a 16K run).
    same_cut = full.max_length in (None, config.max_length)
    p50, p99, basis = _length_percentiles(raw_lengths, recorded_padding if same_cut else None)
    return Workload(
        params=params,
        trainable_params=trainable,
        n_layers=layers,
        hidden_size=hidden,
        flops_k=4.0 if model.method == "lora" else 6.0,
        attention=model.attention == "quadratic",
        recompute=tr.gradient_checkpointing,
        examples=examples,
        epochs=full.epochs or tr.num_train_epochs,
        max_steps=max_steps,
        batch_size=tr.per_device_train_batch_size,
        accumulation=tr.gradient_accumulation_steps,
        gpus=n_gpus,
        cores_per_rank=max(1, cores // n_gpus),
        raw_lengths=raw_lengths,
        loader_s_per_sample=float(pipe.get("loader_s_per_sample") or 0.0),
        loop_s_per_sample=float(pipe.get("loop_s_per_sample") or 0.0),
        pretokenized_s_per_sample=float(pipe.get("pretokenized_s_per_sample") or 0.0),
        format_s_per_example=_per_example(start, "format_s"),
        tokenize_s_per_example=_per_example(start, "tokenize_s"),
        cpu_speed_factor=hw.cpu_speed_factor,
        checkpoint_bytes_per_param=float(ckpt.get("bytes_per_param") or 12.0),
        checkpoint_write_gb_s=hw.checkpoint_write_gb_s,
        mfu=mfu or hw.mfu,
        gpu=gpu,
        price_per_gpu_hour=_price(price, hw.price_per_gpu_hour, gpu, notes),
        length_p50=p50,
        length_p99=p99,
        length_basis=basis,
    )


def _length_percentiles(
    sample: tuple[int, ...], recorded: Mapping[str, Any] | None
) -> tuple[int | None, int | None, str]:
    """(p50, p99, where from) of the lengths the padding fix is sized on.

    The recording's own figures win: they are what the report's rules size
    ``max_length`` and the pad multiple on, and one report must show one value.
    """
    rec = recorded or {}
    if rec.get("p99_length"):
        rows = f" over {rec['batches_seen']} recorded batches" if rec.get("batches_seen") else ""
        return rec.get("p50_length"), int(rec["p99_length"]), f"the replay's recorded lengths{rows}"
    return (
        values.percentile(sample, 50),
        values.percentile(sample, 99),
        f"{len(sample):,} sampled lengths",
    )


def _per_example(start: dict[str, Any], key: str) -> float:
    seconds, n = start.get(key), start.get("examples")
    return float(seconds) / n if seconds and n else 0.0


def _price(cli: float | None, cfg: float | None, gpu: gpus.GpuSpec, notes: list[str]) -> float:
    if cli is not None:
        return cli
    if cfg is not None:
        return cfg
    notes.append(
        f"no price given: used a typical ${gpu.price_per_gpu_hour:.2f}/GPU-hour for {gpu.name} ({gpu.price_source})"
    )
    return gpu.price_per_gpu_hour


def _model_size(
    config: ReplayConfig, measure: dict[str, Any], notes: list[str]
) -> tuple[float, int, int]:
    """(params, n_layers, hidden) of the real model: model.params_b, else the replayed one."""
    model = config.model
    replayed = measure.get("replayed_model") or {}
    if model.params_b is None:
        params = float(replayed.get("params") or 0)
        layers = model.n_layers or int(replayed.get("n_layers") or 1)
        hidden = model.hidden_size or int(replayed.get("hidden_size") or 1)
        notes.append("model.params_b not given: predicting for the replayed model's own size")
        return params, layers, hidden
    params = model.params_b * 1e9
    if model.n_layers and model.hidden_size:
        return params, model.n_layers, model.hidden_size
    layers, hidden = infer_shape(params)
    layers, hidden = model.n_layers or layers, model.hidden_size or hidden
    notes.append(
        f"model.n_layers/hidden_size not given: assumed {layers} x {hidden} for the attention term"
    )
    return params, layers, hidden


def plan_from_config(config: ReplayConfig, w: Workload, notes: list[str]) -> Plan:
    tr = config.training
    precision = "bf16" if tr.bf16 else "fp16" if tr.fp16 else "tf32" if tr.tf32 else "fp32"
    if (precision == "bf16" and w.gpu.bf16_tflops is None) or (
        precision == "tf32" and w.gpu.tf32_tflops is None
    ):
        notes.append(f"{w.gpu.name} has no {precision} tensor cores: predicted at its FP32 rate")
    if precision == "bf16" and tr.tf32 is False:
        notes.append(
            "tf32 is off but bf16 autocast already runs the matmuls in bf16: "
            "turning tf32 on changes only the few fp32 matmuls left (not modelled)"
        )
    return Plan(
        max_length=config.full_run.max_length or config.max_length,
        padding=config.padding,
        workers=tr.dataloader_num_workers,
        precision=precision,
        save_steps=tr.save_steps,
        input_side="configured",
        startup_format=config.text.format_at == "startup",
        startup_tokenize=config.tokenizer.tokenize_at == "startup",
    )


def _memory_notes(w: Workload) -> list[str]:
    need = costmodel.state_gb(w)
    if need <= w.gpu.memory_gb:
        return []
    return [
        f"weights, gradients and AdamW state need ~{need:.0f} GB per GPU without sharding "
        f"(activations not counted); {w.gpu.name} has {w.gpu.memory_gb:g} GB: use ZeRO/FSDP, LoRA or an 8-bit optimizer"
    ]


def _assumptions(w: Workload) -> dict[str, Any]:
    return {
        "flops_per_token": f"{w.flops_k:g}*N"
        + (" + 12*n_layers*hidden*seq" if w.attention else "")
        + f" (PaLM appendix B; {'LoRA: no weight gradients' if w.flops_k == 4 else 'full fine-tune'}"
        + ("" if w.attention else "; attention-free model")
        + ("; gradient checkpointing: + 2*N + 4*n_layers*hidden*seq" if w.recompute else "")
        + ")",
        "mfu": w.mfu,
        "params": w.params,
        "trainable_params": w.trainable_params,
        "n_layers": w.n_layers,
        "hidden_size": w.hidden_size,
        "examples": w.examples,
        "epochs": w.epochs,
        "max_steps": w.max_steps,
        "cores_per_gpu": w.cores_per_rank,
        "cpu_speed_factor": w.cpu_speed_factor,
        "input_pipeline": "measured seconds/sample on one process here / cpu_speed_factor, "
        "over min(workers, cores per GPU) processes; serial with the step when workers=0",
        "optimizer": f"{ADAMW_BYTES_PER_PARAM} bytes/trainable param at "
        f"{BANDWIDTH_EFFICIENCY:.0%} of datasheet bandwidth",
        "checkpoint": f"{w.checkpoint_bytes_per_param:.1f} bytes/trainable param (measured on the replay) "
        f"at {w.checkpoint_write_gb_s:g} GB/s",
        "memory": "weights+grads+AdamW ~16 bytes/trainable param, 2 bytes/frozen param, activations excluded",
        "startup": "startup formatting/tokenization at the measured single-process datasets.map rate",
    }
