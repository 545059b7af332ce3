"""Datasheet figures of common training GPUs, for preflight predictions.

Peak figures are dense (no 2:4 sparsity) tensor-core throughput with FP32
accumulate where the vendor gives both; ``fp32_tflops`` is the non-tensor-core
FP32 rate that plain ``float32`` matmuls get when TF32 is off (PyTorch's default
since 1.12). Prices are typical on-demand $/GPU-hour and vary 2-3x between
providers: always pass the real one (``hardware.price_per_gpu_hour`` or
``--price-per-gpu-hour``). Any figure can be overridden with ``hardware.gpu_spec``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpudoctor.errors import UserError

PRICE_NOTE = (
    "typical on-demand list price, mid-2025, from memory of public price pages; not checked live"
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. TFLOP/s are dense peaks; ``None`` = no hardware support."""

    key: str
    name: str
    bf16_tflops: float | None
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float
    memory_gb: float
    bandwidth_gb_s: float
    price_per_gpu_hour: float
    source: str
    date: str
    price_source: str = PRICE_NOTE

    def peak_tflops(self, precision: str) -> float:
        """Peak for ``bf16|fp16|tf32|fp32``; unsupported formats fall back to FP32."""
        value = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops}.get(
            precision
        )
        return value if value is not None else self.fp32_tflops

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# fmt: off
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("a100-40gb", "NVIDIA A100 40GB SXM4", 312.0, 312.0, 156.0, 19.5, 40, 1555, 1.29,
            "NVIDIA A100 Tensor Core GPU datasheet", "2021-06"),
    GpuSpec("a100-80gb", "NVIDIA A100 80GB SXM4", 312.0, 312.0, 156.0, 19.5, 80, 2039, 1.79,
            "NVIDIA A100 Tensor Core GPU datasheet", "2021-06"),
    GpuSpec("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 989.4, 494.7, 66.9, 80, 3350, 2.99,
            "NVIDIA H100 Tensor Core GPU datasheet", "2023"),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe 80GB", 756.5, 756.5, 378.0, 51.2, 80, 2000, 2.49,
            "NVIDIA H100 Tensor Core GPU datasheet", "2023"),
    GpuSpec("h200", "NVIDIA H200 SXM 141GB", 989.4, 989.4, 494.7, 66.9, 141, 4800, 3.79,
            "NVIDIA H200 Tensor Core GPU datasheet", "2024-11"),
    GpuSpec("l4", "NVIDIA L4 24GB", 121.0, 121.0, 60.0, 30.3, 24, 300, 0.80,
            "NVIDIA L4 Tensor Core GPU datasheet", "2023"),
    GpuSpec("l40s", "NVIDIA L40S 48GB", 362.05, 362.05, 183.0, 91.6, 48, 864, 1.57,
            "NVIDIA L40S GPU datasheet", "2023"),
    GpuSpec("a10g", "NVIDIA A10G 24GB (AWS)", 70.0, 70.0, 35.0, 35.0, 24, 600, 1.01,
            "no NVIDIA datasheet for this AWS-only part; figures as tabulated by Baseten, "
            "'NVIDIA A10 vs A10G for ML model inference'", "2023"),
    GpuSpec("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 165.2, 165.2, 82.6, 82.6, 24, 1008, 0.40,
            "NVIDIA Ada GPU Architecture whitepaper (RTX 4090 table; FP32-accumulate rate)", "2022"),
    GpuSpec("rtx-3090", "NVIDIA GeForce RTX 3090 24GB", 71.0, 71.0, 35.6, 35.6, 24, 936, 0.25,
            "NVIDIA Ampere GA102 GPU Architecture whitepaper (FP32-accumulate rate)", "2020"),
    GpuSpec("v100", "NVIDIA V100 SXM2 32GB", None, 125.0, None, 15.7, 32, 900, 0.50,
            "NVIDIA Tesla V100 GPU datasheet", "2020-01"),
)

ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h100-sxm5": "h100-sxm",
    "a100": "a100-80gb", "a100-sxm": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb",
    "h200-sxm": "h200", "4090": "rtx-4090", "3090": "rtx-3090", "v100-32gb": "v100",
    "v100-sxm2": "v100", "l40s-48gb": "l40s", "a10": "a10g",
    # names as NVML reports them (nvmlDeviceGetName), so a replay on a GPU finds its own
    "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H100 PCIe": "h100-pcie", "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA L40S": "l40s", "NVIDIA GeForce RTX 4090": "rtx-4090", "NVIDIA GeForce RTX 3090": "rtx-3090",
    "Tesla V100-SXM2-32GB": "v100",
}
# fmt: on


def _norm(name: str) -> str:
    """'NVIDIA A100 80GB', 'a100_80gb' and 'A100-80GB' all become 'a10080gb'."""
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[^a-z0-9]", "", text)


_BY_NORM: dict[str, str] = {_norm(g.key): g.key for g in GPUS}
_BY_NORM.update({_norm(alias): key for alias, key in ALIASES.items()})
_BY_NORM.update({_norm(g.name): g.key for g in GPUS})


def known_keys() -> list[str]:
    return [g.key for g in GPUS]


def find(name: str) -> GpuSpec | None:
    """The GPU called ``name`` (key, alias or full name, any case), or ``None``."""
    key = _BY_NORM.get(_norm(name))
    return next((g for g in GPUS if g.key == key), None)


def lookup(name: str, overrides: Mapping[str, object] | None = None) -> GpuSpec:
    """The GPU ``name`` with ``overrides`` applied; unknown names list the known ones.

    An unknown name is still accepted when ``overrides`` give ``memory_gb``,
    ``bandwidth_gb_s`` and ``bf16_tflops`` or ``fp32_tflops`` (a GPU this table lacks).
    """
    given: dict[str, Any] = {
        k: v for k, v in (overrides or {}).items() if v is not None and k != "name"
    }
    label = str((overrides or {}).get("name") or name)
    spec = find(name)
    if spec is None:
        if not (
            {"memory_gb", "bandwidth_gb_s"} <= given.keys()
            and given.keys() & {"bf16_tflops", "fp32_tflops"}
        ):
            raise UserError(
                f"unknown target GPU {name!r}; known: {', '.join(known_keys())} (or describe it with "
                "hardware.gpu_spec: bf16_tflops, fp32_tflops, memory_gb, bandwidth_gb_s)"
            )
        fp32 = float(given.get("fp32_tflops") or given["bf16_tflops"])
        spec = GpuSpec(
            name,
            label,
            None,
            None,
            None,
            fp32,
            0.0,
            0.0,
            0.0,
            "user-supplied hardware.gpu_spec",
            "n/a",
            "none: set hardware.price_per_gpu_hour",
        )
    elif given:
        spec = dataclasses.replace(spec, source=spec.source + " (with hardware.gpu_spec overrides)")
    return dataclasses.replace(spec, **given)
