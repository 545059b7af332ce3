"""One GPU table: one price and one spec per GPU, whoever asks (report, replay, sweep)."""

from __future__ import annotations

import pytest

from gpudoctor.common import hardware
from gpudoctor.replay import gpus
from gpudoctor.replay.config import load_config_text
from gpudoctor.report import cost
from gpudoctor.sweep.costs import point_cost

# What nvmlDeviceGetName returns on these parts, and the row each must find.
NVML_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA L4": "l4",
    "NVIDIA A10G": "a10g",
    "NVIDIA A10": "a10",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "Tesla V100-SXM2-32GB": "v100",
    "Tesla T4": "t4",
}


def test_every_gpu_has_one_row_and_one_positive_price() -> None:
    keys = hardware.known_keys()
    assert len(keys) == len(set(keys))
    for spec in hardware.GPUS:
        assert spec.price_per_gpu_hour > 0 and spec.price_source
        assert hardware.find(spec.key) is spec and hardware.find(spec.name) is spec


@pytest.mark.parametrize("nvml_name,key", sorted(NVML_NAMES.items()))
def test_cost_and_replay_agree_on_an_nvml_name(nvml_name: str, key: str) -> None:
    spec = gpus.find(nvml_name)
    assert spec is not None and spec.key == key
    assert spec is hardware.find(nvml_name)
    assert cost.table_price(nvml_name) == spec.price_per_gpu_hour
    assert gpus.lookup(nvml_name).price_per_gpu_hour == spec.price_per_gpu_hour


def test_every_row_is_reached_by_some_nvml_name() -> None:
    assert set(NVML_NAMES.values()) == set(hardware.known_keys())


def test_names_that_only_share_letters_do_not_match() -> None:
    # "L4" inside "L40", "A10" inside "A100": whole words only
    assert hardware.find("NVIDIA L40") is None
    assert hardware.find("NVIDIA RTX A6000") is None
    assert cost.table_price("NVIDIA RTX A6000") is None
    assert hardware.find("") is None and cost.table_price(None) is None


def test_the_report_prices_an_h100_at_what_the_seeds_paid() -> None:
    price = cost.resolve_price(None, None, ["NVIDIA H100 80GB HBM3"])
    assert price.per_gpu_hour_usd == 2.50 == hardware.find("h100").price_per_gpu_hour
    assert price.source == (
        f"gpudoctor built-in table ({hardware.PRICE_DATE}, approximate on-demand prices) "
        "for NVIDIA H100 80GB HBM3"
    )


def test_sweep_prices_a_gpu_trial_from_the_same_table() -> None:
    cfg = load_config_text("dataset: {kind: synthetic, count: 100}\nhardware: {gpus: 1}\n")
    metrics = {"nonpad_tokens_per_s": 1000.0, "samples_per_s": 10.0}
    got = point_cost(cfg, metrics, None, "cuda", "NVIDIA GeForce RTX 4090", None, None, None)
    assert got["price_per_gpu_hour"] == cost.table_price("NVIDIA GeForce RTX 4090") == 0.70
