"""Background samplers: NVML (GPU) and psutil (host), each on its own thread.

They write raw rows to ``samples/gpu.jsonl`` and ``samples/host.jsonl`` of a run
folder; see :mod:`gpudoctor.samplers.nvml` and :mod:`gpudoctor.samplers.host`
for the fields. The names here load lazily: importing one sampler never imports psutil or
NVML for another.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GpuSampler", "HostSampler", "Nvml", "RowWriter", "Sampler"]


def __getattr__(name: str) -> Any:
    if name in ("RowWriter", "Sampler"):
        from gpudoctor.samplers import base

        return getattr(base, name)
    if name == "HostSampler":
        from gpudoctor.samplers.host import HostSampler

        return HostSampler
    if name in ("GpuSampler", "Nvml"):
        from gpudoctor.samplers import nvml

        return getattr(nvml, name)
    raise AttributeError(name)
