"""Dollars per point: per million non-pad tokens, and for the whole run, at the point's
measured speed.

Both figures follow the speed the trial measured (tokens/s and samples/s) at one price
per GPU-hour: the one given (``--price-per-gpu-hour`` or ``GPUDOCTOR_PRICE_PER_GPU_HOUR``),
the config's ``hardware.price_per_gpu_hour``, on a GPU the table's price for the name NVML
reports, else the target GPU's typical list price (:mod:`gpudoctor.common.hardware`). With none,
the figures are null: a price is never invented. So a point twice as fast costs half as
much per token, and the column ranks the points as the speed does.

With a target GPU and no GPU here, preflight's prediction of the full run on that GPU
(which scales the trial's own measurements) is kept beside them, under ``predicted``:
it answers another question (what the rented run will cost), not the ranking.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.common.hardware import price_per_gpu_hour
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.preflight import predict

NONE: dict[str, Any] = {
    "usd_per_mtok": None,
    "run_usd": None,
    "run_hours": None,
    "basis": None,
    "price_per_gpu_hour": None,
    "price_source": None,
    "predicted": None,
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
    target = target or cfg.hardware.target
    on_gpu = device == "cuda"
    rate, source = _price(cfg, price, gpu_name if on_gpu else None, None if on_gpu else target)
    where = f"on {gpu_name or 'this GPU'}" if on_gpu else "on this machine"
    out = _measured(cfg, metrics, measure, rate, gpus_count)
    if out["price_per_gpu_hour"] is not None:
        out["basis"] = f"measured speed {where} at ${rate:g}/GPU-hour ({source})"
        out["price_source"] = source
    if not on_gpu and target and measure is not None:
        try:
            out["predicted"] = _predicted(cfg, measure, target, price, gpus_count)
        except UserError:  # preflight cannot model this config: the measured figures stand
            out["predicted"] = None
    return out


def _price(
    cfg: ReplayConfig, given: float | None, gpu_name: str | None, target: str | None
) -> tuple[float | None, str | None]:
    """The price per GPU-hour and where it came from, by precedence."""
    if given is not None:
        return given, "given"
    if cfg.hardware.price_per_gpu_hour is not None:
        return cfg.hardware.price_per_gpu_hour, "the config's hardware.price_per_gpu_hour"
    if gpu_name:
        table = price_per_gpu_hour(gpu_name)
        if table is not None:
            return table, f"typical price of {gpu_name}, pass --price-per-gpu-hour"
    if target:
        table = price_per_gpu_hour(target)
        if table is not None:
            return table, f"typical {target} list price, pass --price-per-gpu-hour"
    return None, None


def _measured(
    cfg: ReplayConfig,
    metrics: dict[str, Any],
    measure: dict[str, Any] | None,
    price: float | None,
    gpus_count: int | None,
) -> dict[str, Any]:
    """$/M tokens and the run's $ from the measured speed: n GPUs cost n prices and train n
    times the samples, so the price per token is the one GPU's price over its tokens/s."""
    tokens_s, samples_s = metrics.get("nonpad_tokens_per_s"), metrics.get("samples_per_s")
    if price is None or not samples_s:
        return dict(NONE)
    n = gpus_count or cfg.hardware.gpus
    samples = run_samples(cfg, measure)
    hours = samples / (samples_s * n) / 3600 if samples else None
    return {
        **NONE,
        "usd_per_mtok": price / 3600 / tokens_s * 1e6 if tokens_s else None,
        "run_usd": hours * price * n if hours is not None else None,
        "run_hours": hours,
        "price_per_gpu_hour": price,
    }


def _predicted(
    cfg: ReplayConfig,
    measure: dict[str, Any],
    target: str,
    price: float | None,
    gpus_count: int | None,
) -> dict[str, Any]:
    before = predict(cfg, measure, target=target, price_per_gpu_hour=price, gpus_count=gpus_count)
    run = before["before"]
    return {
        "target": before["target"]["name"],
        "run_usd": run["cost_usd"],
        "run_hours": run["wall_h"],
        "tokens_per_s": run["tokens_per_s"],
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
