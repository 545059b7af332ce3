"""What the run costs, and what its waste costs.

Price per GPU-hour, in order: ``--price-per-gpu-hour``, ``GPUDOCTOR_PRICE_PER_GPU_HOUR``,
then the built-in table keyed by the name NVML reports (:mod:`gpudoctor.common.hardware`,
the same table replay and sweep price a target GPU with). Without a GPU and
without a stated price there are no dollars: we say so rather than guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpudoctor.common.errors import UserError
from gpudoctor.common.hardware import PRICE_DATE, price_per_gpu_hour
from gpudoctor.core.schema import Cost

PRICE_TABLE_DATE = PRICE_DATE
PRICE_TABLE_SOURCE = f"gpudoctor built-in table ({PRICE_TABLE_DATE}, approximate on-demand prices)"


@dataclass
class Price:
    per_gpu_hour_usd: float | None
    gpus: int
    source: str

    @property
    def usd_per_hour(self) -> float | None:
        if self.per_gpu_hour_usd is None or self.gpus <= 0:
            return None
        return self.per_gpu_hour_usd * self.gpus


def table_price(gpu_name: str | None) -> float | None:
    """The built-in price for an NVML name, from the one GPU table (:mod:`gpudoctor.common.hardware`)."""
    return price_per_gpu_hour(gpu_name)


def resolve_price(cli_price: float | None, cli_gpus: int | None, gpu_names: list[str],
                  cli_source: str = "--price-per-gpu-hour") -> Price:
    """``cli_source`` names where ``cli_price`` came from (a replay config's hardware section...)."""
    env = os.environ.get("GPUDOCTOR_PRICE_PER_GPU_HOUR")
    seen = len(gpu_names)
    gpus = cli_gpus if cli_gpus is not None else seen
    if cli_price is not None:
        return Price(cli_price, gpus or 1, cli_source)
    if env:
        try:
            return Price(float(env), gpus or 1, "GPUDOCTOR_PRICE_PER_GPU_HOUR")
        except ValueError:
            raise UserError(
                f"GPUDOCTOR_PRICE_PER_GPU_HOUR={env!r} is not a number; "
                "set it to USD per GPU-hour, e.g. 2.50"
            ) from None
    if seen:
        price = table_price(gpu_names[0])
        if price is not None:
            return Price(price, gpus, f"{PRICE_TABLE_SOURCE} for {gpu_names[0]}")
        return Price(None, gpus, f"no price known for {gpu_names[0]}: pass --price-per-gpu-hour")
    return Price(
        None, gpus, "no GPU seen and no price given: pass --price-per-gpu-hour for dollars"
    )


def cost_section(
    price: Price, wasted_fraction: float, duration_s: float, projected_run_s: float | None
) -> Cost:
    per_hour = price.usd_per_hour
    wasted = per_hour * wasted_fraction if per_hour is not None else None
    run_h = projected_run_s / 3600 if projected_run_s else None
    section: Cost = {
        "usd_per_hour": _r(per_hour),
        "wasted_usd_per_hour": _r(wasted),
        "wasted_fraction": round(wasted_fraction, 4),
        "wasted_usd_so_far": _r(wasted * duration_s / 3600) if wasted is not None else None,
        "projected_run_hours": _r(run_h),
        "projected_run_usd": _r(per_hour * run_h) if per_hour is not None and run_h else None,
        "projected_wasted_usd": _r(wasted * run_h) if wasted is not None and run_h else None,
        "price_source": price.source,
    }
    return section


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None
