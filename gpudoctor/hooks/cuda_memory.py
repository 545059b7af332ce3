"""The CUDA caching allocator at step ends: allocated, reserved and peak, without a sync.

NVML sees what the process holds on the device (live tensors, the allocator's cached blocks and the
CUDA context together); the allocator's own counters tell them apart, which is what names a leak:
*allocated* that grows is tensors kept across steps (a list of losses with their graphs, a tensor
carried into the next step's graph), *reserved* that grows while allocated stays flat is the cache
(blocks of ever-new sizes, fragmentation). ``torch.cuda.memory_stats`` reads host-side counters:
no sync, no kernel; it builds a dict of a few hundred entries (tens of microseconds), so a line is
written at the first :data:`EVERY_STEP_UNTIL` step ends, then at most every :data:`EVERY_S`.

The narrow boundary is :class:`DeviceMemory` (one ``read``), as :class:`DeviceClock` is for the
GPU's clock: tests put a fake allocator there (``tests/fake_cuda.py``). The peak is never reset:
``reset_peak_memory_stats`` is the training's to call, so ``peak_mib`` is the most allocated since
the process (or the training's last reset) began. Stdlib only: this loads into the training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from gpudoctor.core.events import CudaMemEvent

EVERY_STEP_UNTIL = 5  # the first steps each: where the allocator warms up
EVERY_S = 0.5  # then at most this often
MIB = 2.0**20


class DeviceMemory(Protocol):
    """The allocator's counters on the training's device; nothing here may block the host."""

    def read(self) -> tuple[float, float, float]:
        """(allocated, reserved, peak allocated) in bytes, now."""

    def total(self) -> float | None:
        """The device's memory in bytes (None: unknown)."""


class CudaMemory:
    """``torch.cuda.memory_stats`` of the current device: one call, three of its counters."""

    def __init__(self, torch: Any) -> None:
        self._cuda = torch.cuda
        self._device = torch.cuda.current_device()

    def read(self) -> tuple[float, float, float]:
        stats = self._cuda.memory_stats(self._device)
        return (float(stats.get("allocated_bytes.all.current", 0)), float(stats.get("reserved_bytes.all.current", 0)),
                float(stats.get("allocated_bytes.all.peak", 0)))

    def total(self) -> float | None:
        return float(self._cuda.get_device_properties(self._device).total_memory)


class AllocatorLines:
    """Writes ``cuda_mem`` lines at step ends, paced (see the module's docstring)."""

    def __init__(self, memory: DeviceMemory, emit: Callable[[CudaMemEvent], None],
                 now: Callable[[], float] = time.time) -> None:
        self._memory = memory
        self._emit = emit
        self._now = now
        self._last_t = float("-inf")
        self._total_said = False

    def step_end(self, n: int) -> None:
        t = self._now()
        if n > EVERY_STEP_UNTIL and t - self._last_t < EVERY_S:
            return
        self._last_t = t
        allocated, reserved, peak = self._memory.read()
        event: CudaMemEvent = {"k": "cuda_mem", "t": t, "n": n, "allocated_mib": allocated / MIB,
                                 "reserved_mib": reserved / MIB, "peak_mib": peak / MIB}
        if not self._total_said:
            self._total_said = True
            total = self._memory.total()
            event["total_mib"] = total / MIB if total else None
        self._emit(event)
