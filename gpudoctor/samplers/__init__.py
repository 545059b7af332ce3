"""Background samplers: NVML (GPU) and psutil (host), each on its own thread.

They write raw rows to ``samples/gpu.jsonl`` and ``samples/host.jsonl`` of a run
folder; see :mod:`gpudoctor.samplers.nvml` and :mod:`gpudoctor.samplers.host`
for the fields.
"""

from gpudoctor.samplers.base import RowWriter, Sampler
from gpudoctor.samplers.host import HostSampler
from gpudoctor.samplers.nvml import GpuSampler, Nvml

__all__ = ["GpuSampler", "HostSampler", "Nvml", "RowWriter", "Sampler"]
