"""A fake ``pynvml`` at the binding boundary, for tests without a GPU.

The error classes are built the way nvidia-ml-py builds its own:
``NVMLError(code)`` returns the subclass for that code (``NVMLError_NotSupported``
for ``NVML_ERROR_NOT_SUPPORTED`` ...), so code that catches the real binding's
errors catches these. ``FakeBinding(errors=pynvml)`` raises the real module's
classes instead; a test checks the names and codes below against pynvml.
"""

from __future__ import annotations

import string
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Codes as in nvidia-ml-py (pynvml.NVML_ERROR_*); checked against it in test_nvml.py.
ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_UNKNOWN": 999,
}
_STRINGS = {
    3: "Not Supported",
    4: "Insufficient Permissions",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
    18: "RM has detected an NVML/RM version mismatch.",
    999: "Unknown Error",
}
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


class NVMLError(Exception):
    """``NVMLError(code)`` is an instance of the subclass registered for ``code``."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _class_name(code_name: str) -> str:
    suffix = code_name.replace("NVML_ERROR_", "")
    return "NVMLError_" + string.capwords(suffix, "_").replace("_", "")


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for code_name, code in ERROR_CODES.items():
        setattr(module, code_name, code)

        def new(cls: type, *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(_class_name(code_name), (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()


@dataclass
class FakeGpu:
    """One fake device; ``unsupported`` names functions answering NotSupported."""

    name: str
    uuid: str
    mem_total_b: int
    mem_used_b: int
    util_pct: int
    power_mw: int
    sm_clock_mhz: int
    pcie_tx_kib_s: int = 0
    pcie_rx_kib_s: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False


class FakeBinding:
    """Module-like stand-in for ``pynvml``; records every device call in ``calls``."""

    def __init__(
        self, gpus: list[FakeGpu], init_error: int | None = None, errors: Any = None
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.errors = errors if errors is not None else sys.modules[__name__]
        self.calls: list[tuple[str, int | None]] = []
        self.initialized = False
        self.NVMLError = self.errors.NVMLError

    def __getattr__(self, name: str) -> Any:  # NVML_ERROR_* codes and NVMLError_* classes
        if name.startswith(("NVML_", "NVMLError_")):
            return getattr(self.errors, name)
        raise AttributeError(name)

    def _raise(self, code_name: str) -> None:
        raise self.errors.NVMLError(getattr(self.errors, code_name))

    def _gpu(self, func: str, handle: FakeGpu) -> FakeGpu:
        self.calls.append((func, self.gpus.index(handle)))
        if not self.initialized:
            self._raise("NVML_ERROR_UNINITIALIZED")
        if handle.lost:
            self._raise("NVML_ERROR_GPU_IS_LOST")
        if func in handle.unsupported:
            self._raise("NVML_ERROR_NOT_SUPPORTED")
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.errors.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            self._raise("NVML_ERROR_INVALID_ARGUMENT")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.mem_total_b - gpu.mem_used_b
        return SimpleNamespace(total=gpu.mem_total_b, used=gpu.mem_used_b, free=free)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(
            gpu=self._gpu("nvmlDeviceGetUtilizationRates", handle).util_pct, memory=0
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        assert clock_type == NVML_CLOCK_SM
        return self._gpu("nvmlDeviceGetClockInfo", handle).sm_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, handle: FakeGpu, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        return gpu.pcie_tx_kib_s if counter == NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kib_s

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.procs]
