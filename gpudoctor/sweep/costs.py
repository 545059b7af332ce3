"""Dollars per point: per million non-pad tokens, and for the whole run.

Where the trial trained on a GPU, its measured rate is priced (the given price,
the config's, or the one GPU table's, :mod:`gpudoctor.hardware`). On a CPU box the measured rate is
not the target's, so with a target GPU the point goes through preflight, which
scales the trial's own measurements to that GPU. With neither, the figures are
null: a price is never invented.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.hardware import price_per_gpu_hour
from gpudoctor.replay.config import ReplayConfig

NONE: dict[str, Any] = {
    "usd_per_mtok": None,
    "run_usd": None,
    "run_hours": None,
    "basis": None,
    "price_per_gpu_hour": None,
}


def point_cost(
    cfg: ReplayConfig,
    metrics: dict[str, Any],
    measure: dict[str, Any] | None,
    device: str | None,
    gpu_name: str | None,
    target: str | None,
    price: float | None,
    gpus_count: int | None,
) -> dict[str, Any]:
    """The cost figures of one measured point (all None when nothing prices it)."""
    if device == "cuda":
        rate = price if price is not None else cfg.hardware.price_per_gpu_hour
        if rate is None:
            rate = price_per_gpu_hour(gpu_name)  # the report's table price for this NVML name
        return _measured(
            cfg, metrics, measure, rate, gpus_count, f"measured on {gpu_name or 'this GPU'}"
        )
    target = target or cfg.hardware.target
    if target and measure is not None:
        return _predicted(cfg, measure, target, price, gpus_count)
    if price is not None:
        return _measured(
            cfg, metrics, measure, price, gpus_count, "measured on this machine at the given price"
        )
    return dict(NONE)


def _measured(
    cfg: ReplayConfig,
    metrics: dict[str, Any],
    measure: dict[str, Any] | None,
    price: float | None,
    gpus_count: int | None,
    basis: str,
) -> dict[str, Any]:
    tokens_s, samples_s = metrics.get("nonpad_tokens_per_s"), metrics.get("samples_per_s")
    if price is None or not samples_s:
        return dict(NONE)
    n = gpus_count or cfg.hardware.gpus
    samples = run_samples(cfg, measure)
    hours = samples / (samples_s * n) / 3600 if samples else None
    return {
        "usd_per_mtok": price / 3600 / tokens_s * 1e6 if tokens_s else None,
        "run_usd": hours * price * n if hours is not None else None,
        "run_hours": hours,
        "basis": basis,
        "price_per_gpu_hour": price,
    }


def _predicted(
    cfg: ReplayConfig,
    measure: dict[str, Any],
    target: str,
    price: float | None,
    gpus_count: int | None,
) -> dict[str, Any]:
    from gpudoctor.replay.preflight import predict

    before = predict(cfg, measure, target=target, price_per_gpu_hour=price, gpus_count=gpus_count)
    run = before["before"]
    given = price is not None or cfg.hardware.price_per_gpu_hour is not None
    tokens = run["tokens_per_s"] * run["wall_h"] * 3600
    return {
        "usd_per_mtok": run["cost_usd"] / tokens * 1e6 if tokens else None,
        "run_usd": run["cost_usd"],
        "run_hours": run["wall_h"],
        "basis": f"predicted for {before['target']['name']} by preflight"
        + ("" if given else " at its typical list price (pass --price-per-gpu-hour)"),
        "price_per_gpu_hour": before["target"]["price_per_gpu_hour"],
    }


def run_samples(cfg: ReplayConfig, measure: dict[str, Any] | None) -> float | None:
    """Samples the whole run trains on: fixed steps x global batch, else examples x epochs."""
    full, tr = cfg.full_run, cfg.training
    global_batch = (
        tr.per_device_train_batch_size * tr.gradient_accumulation_steps * cfg.hardware.gpus
    )
    steps = full.max_steps or (tr.max_steps if tr.max_steps > 0 else None)
    if steps:
        return float(steps * global_batch)
    examples = full.examples or cfg.dataset.count or (measure or {}).get("dataset_rows_total")
    return float(examples) * (full.epochs or tr.num_train_epochs) if examples else None
