"""The preflight model checked against the GPU the replay just ran on.

When ``gpudoctor replay`` finds a GPU, the replay's loop runs on it, and the
same arithmetic that predicts a full run on a rented GPU is applied to the
replay itself: this GPU (its NVML name looked up in :mod:`.gpus`), the replayed
model's own size, the replay's batch, padding and workers, this machine's cores.
The prediction is set beside what the recording measured, row by row, with the
MFU the replay actually achieved, so a user can see how far to trust the
full-run prediction and re-run it with ``--mfu`` at the achieved figure.

Nothing here is invented: on a CPU replay there is no section (the report says
why), and a measured figure the recording lacks is ``None``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from gpudoctor.core.schema import CheckRow, PredictionCheck, Report
from gpudoctor.replay import gpus
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.costmodel import simulate
from gpudoctor.replay.preflight import plan_from_config, workload

ON_CPU_NOTE = ("the replay ran on the CPU, so there is no GPU measurement to set beside the prediction; "
               "run it on a machine with a GPU to check the model there")


def compare(config: ReplayConfig, measure: dict[str, Any], report: Report,
            mfu: float | None = None) -> PredictionCheck | None:
    """Prediction vs measurement for the replay on this machine's GPU; ``None`` after a CPU replay."""
    if measure.get("device") != "cuda":
        return None
    names = [str(g.get("name") or "") for g in (report.get("run") or {}).get("gpus") or []]
    name = names[0] if names else ""
    spec = gpus.find(name) if name else None  # hardware.gpu_spec describes the target, not this GPU
    section: PredictionCheck = {"gpu": name or None, "known": spec is not None, "rows": [], "notes": []}
    if spec is None:
        section["notes"].append(
            f"this GPU ({name or 'not seen by NVML'}) is not in gpudoctor's table "
            f"({', '.join(gpus.known_keys())}), so nothing was predicted for it")
        return section
    # workload()'s notes are about the full run (its size, price, cores): not this check's
    w = workload(config, measure, spec, [], mfu=mfu, gpus_count=1)
    model = measure.get("replayed_model") or {}
    params = float(model.get("params") or w.params)
    training = measure.get("training") or {}
    w = dataclasses.replace(
        w,
        params=params,
        trainable_params=params * config.model.lora_fraction if config.model.method == "lora" else params,
        n_layers=int(model.get("n_layers") or w.n_layers),
        hidden_size=int(model.get("hidden_size") or w.hidden_size),
        cores_per_rank=int(measure.get("cpu_count") or 1),
        cpu_speed_factor=1.0,  # the pipeline was measured on this very CPU
        max_steps=max(1, int(training.get("steps") or 1)),
    )
    notes: list[str] = []  # precision notes (no bf16 tensor cores on this GPU, ...)
    plan = dataclasses.replace(plan_from_config(config, w, notes), max_length=config.max_length, save_steps=None)
    sim = simulate(plan, w)
    step_s = sim["step_s"]
    measured = _measured(report, training)
    flops_per_step = sim["flops_per_sample"] * w.batch_size * w.accumulation
    peak = sim["peak_tflops"] * 1e12
    achieved = flops_per_step / (measured["step_s"] * peak) if measured["step_s"] else None
    section.update({
        "target": spec.key,
        "mfu_assumed": w.mfu,
        "mfu_achieved": achieved,
        "precision": sim["precision"],
        "rows": [
            _row("step time", "s", step_s, measured["step_s"]),
            _row("GPU busy while training", "fraction", sim["compute_s_per_step"] / step_s, measured["gpu_busy"]),
            _row("data wait, share of training time", "fraction", sim["data_wait_s_per_step"] / step_s,
                 measured["data_wait"]),
            _row("samples/s", "per_s", w.batch_size * w.accumulation / step_s, measured["samples_per_s"]),
        ],
    })
    if achieved is not None and achieved < w.mfu / 2:
        section["notes"].append(
            f"the replay reached MFU {achieved:.2g}, far below the assumed {w.mfu:g}: a small replayed model "
            "is bound by kernel launches and the optimizer, not FLOPs; for the full-size model keep the "
            "assumed MFU or measure it with the real model (model.params_b and a full-size replay)")
    section["notes"].extend(notes)
    return section


def _row(label: str, unit: str, predicted: float | None, measured: float | None) -> CheckRow:
    ratio = measured / predicted if predicted and measured is not None else None
    return {"figure": label, "unit": unit, "predicted": predicted, "measured": measured, "measured_over_predicted": ratio}


def _measured(report: Report, training: dict[str, Any]) -> dict[str, float | None]:
    """The replay's own figures, over its training (not its startup)."""
    steps = report.get("steps") or {}
    p50 = ((steps.get("step_time_s") or {}).get("p50"))
    breakdown = report.get("breakdown") or {}
    training_share = 1.0 - float(breakdown.get("startup") or 0.0)
    wait = breakdown.get("data_wait")
    seconds = training.get("seconds")
    return {
        "step_s": float(p50) if p50 else None,
        "gpu_busy": _busy_while_training(report),
        "data_wait": float(wait) / training_share if wait is not None and training_share > 0 else None,
        "samples_per_s": training["samples"] / seconds if seconds and training.get("samples") else None,
    }


def _busy_while_training(report: Report) -> float | None:
    """Mean NVML utilization from the first step on (the timeline's GPU series)."""
    series = (report.get("timeline") or {}).get("series") or {}
    times, busy = series.get("gpu_t_s"), series.get("gpu_busy_pct")
    first = (report.get("steps") or {}).get("first_step_at_s")
    if not times or not busy or first is None:
        share = (report.get("shares") or {}).get("gpu_busy")
        return float(share) if share is not None else None
    values = [b for t, b in zip(times, busy, strict=False) if t >= first and b is not None]
    return statistics.fmean(values) / 100 if values else None
