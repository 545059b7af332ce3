"""Replay's view of the GPU table in :mod:`gpudoctor.common.hardware`: a target named in a config.

The specs, prices and name matching live in :mod:`gpudoctor.common.hardware`, shared with the
report's pricing; this module adds what a replay config brings: ``hardware.gpu_spec``
overrides, and a GPU the table lacks described in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.common.hardware import GPUS, PRICE_NOTE, GpuSpec, find, known_keys

__all__ = ["GPUS", "PRICE_NOTE", "GpuSpec", "find", "known_keys", "lookup"]


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
