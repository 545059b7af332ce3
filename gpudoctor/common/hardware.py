"""One table of GPUs: datasheet figures, one price per GPU-hour, and how a name finds its row.

The report prices a recording by the name NVML gives ("NVIDIA H100 80GB HBM3"); replay
and sweep predict on a target key ("h100"). Both look a GPU up here, so one GPU can
never carry two prices or two specs.

Peak figures are dense (no 2:4 sparsity) tensor-core throughput with FP32 accumulate
where the vendor gives both; ``fp32_tflops`` is the non-tensor-core FP32 rate that plain
``float32`` matmuls get when TF32 is off (PyTorch's default since 1.12). Prices are
approximate on-demand $/GPU-hour and vary 2-3x between providers: the real one
(``--price-per-gpu-hour``, ``hardware.price_per_gpu_hour``) always wins.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

PRICE_DATE = "2026-11"
PRICE_NOTE = f"approximate on-demand list price, {PRICE_DATE}; not checked live"
# What users paid in docs/seeds: one H100 at $2.50/h (seed 001; seed 002 ~$2.49/h).
SEED_H100 = f"what seed 001 paid for one H100 ($2.50/h; seed 002 ~$2.49/h), confirmed {PRICE_DATE}"


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
    GpuSpec("a100-40gb", "NVIDIA A100 40GB SXM4", 312.0, 312.0, 156.0, 19.5, 40, 1555, 1.30,
            "NVIDIA A100 Tensor Core GPU datasheet", "2021-06"),
    GpuSpec("a100-80gb", "NVIDIA A100 80GB SXM4", 312.0, 312.0, 156.0, 19.5, 80, 2039, 1.80,
            "NVIDIA A100 Tensor Core GPU datasheet", "2021-06"),
    GpuSpec("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 989.4, 494.7, 66.9, 80, 3350, 2.50,
            "NVIDIA H100 Tensor Core GPU datasheet", "2023", SEED_H100),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe 80GB", 756.5, 756.5, 378.0, 51.2, 80, 2000, 2.50,
            "NVIDIA H100 Tensor Core GPU datasheet", "2023",
            f"{SEED_H100}; PCIe parts often rent for less"),
    GpuSpec("h200", "NVIDIA H200 SXM 141GB", 989.4, 989.4, 494.7, 66.9, 141, 4800, 3.50,
            "NVIDIA H200 Tensor Core GPU datasheet", "2024-11"),
    GpuSpec("l4", "NVIDIA L4 24GB", 121.0, 121.0, 60.0, 30.3, 24, 300, 0.70,
            "NVIDIA L4 Tensor Core GPU datasheet", "2023"),
    GpuSpec("l40s", "NVIDIA L40S 48GB", 362.05, 362.05, 183.0, 91.6, 48, 864, 1.00,
            "NVIDIA L40S GPU datasheet", "2023"),
    GpuSpec("a10g", "NVIDIA A10G 24GB (AWS)", 70.0, 70.0, 35.0, 35.0, 24, 600, 1.00,
            "no NVIDIA datasheet for this AWS-only part; figures as tabulated by Baseten, "
            "'NVIDIA A10 vs A10G for ML model inference'", "2023"),
    GpuSpec("a10", "NVIDIA A10 24GB", 125.0, 125.0, 62.5, 31.2, 24, 600, 0.75,
            "NVIDIA A10 Tensor Core GPU datasheet", "2021"),
    GpuSpec("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 165.2, 165.2, 82.6, 82.6, 24, 1008, 0.70,
            "NVIDIA Ada GPU Architecture whitepaper (RTX 4090 table; FP32-accumulate rate)", "2022"),
    GpuSpec("rtx-3090", "NVIDIA GeForce RTX 3090 24GB", 71.0, 71.0, 35.6, 35.6, 24, 936, 0.30,
            "NVIDIA Ampere GA102 GPU Architecture whitepaper (FP32-accumulate rate)", "2020"),
    GpuSpec("v100", "NVIDIA V100 SXM2 32GB", None, 125.0, None, 15.7, 32, 900, 0.90,
            "NVIDIA Tesla V100 GPU datasheet", "2020-01"),
    GpuSpec("t4", "NVIDIA T4 16GB", None, 65.0, None, 8.1, 16, 320, 0.35,
            "NVIDIA T4 Tensor Core GPU datasheet", "2019"),
)

ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h100-sxm5": "h100-sxm",
    "a100": "a100-80gb", "a100-sxm": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb",
    "h200-sxm": "h200", "4090": "rtx-4090", "3090": "rtx-3090", "v100-32gb": "v100",
    "v100-sxm2": "v100", "l40s-48gb": "l40s",
}

# Any other spelling (NVML names such as "NVIDIA A100-PCIE-40GB", "Tesla T4"): the first
# pattern over the name's lower-case words wins, so the more specific part comes first.
PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bh100\b.*\bpcie\b", "h100-pcie"), (r"\bh100\b", "h100-sxm"), (r"\bh200\b", "h200"),
    (r"\ba100\b.*\b40gb\b", "a100-40gb"), (r"\ba100\b", "a100-80gb"),
    (r"\bl40s\b", "l40s"), (r"\bl4\b", "l4"), (r"\ba10g\b", "a10g"), (r"\ba10\b", "a10"),
    (r"\b4090\b", "rtx-4090"), (r"\b3090\b", "rtx-3090"), (r"\bv100\b", "v100"), (r"\bt4\b", "t4"),
)
# fmt: on

_BY_KEY: dict[str, GpuSpec] = {g.key: g for g in GPUS}


def _norm(name: str) -> str:
    """'NVIDIA A100 80GB', 'a100_80gb' and 'A100-80GB' all become 'a10080gb'."""
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[^a-z0-9]", "", text)


_BY_NORM: dict[str, str] = {_norm(g.key): g.key for g in GPUS}
_BY_NORM.update({_norm(alias): key for alias, key in ALIASES.items()})
_BY_NORM.update({_norm(g.name): g.key for g in GPUS})


def known_keys() -> list[str]:
    return [g.key for g in GPUS]


def find(name: str | None) -> GpuSpec | None:
    """The GPU called ``name``: a key, an alias, a full or an NVML name, any case; else None."""
    if not name:
        return None
    key = _BY_NORM.get(_norm(name))
    if key is None:
        words = " ".join(re.findall(r"[a-z0-9]+", name.lower()))
        key = next((k for pattern, k in PATTERNS if re.search(pattern, words)), None)
    return _BY_KEY.get(key) if key else None


def price_per_gpu_hour(name: str | None) -> float | None:
    """The table's one price for the GPU called ``name`` (None: not in the table)."""
    spec = find(name)
    return spec.price_per_gpu_hour if spec else None
