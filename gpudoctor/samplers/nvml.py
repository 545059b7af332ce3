"""GPU samples through one door to NVML.

Every NVML call goes through :meth:`Nvml.query`, so an unsupported field, a
lost GPU or a missing driver is handled in one place: the value becomes
``None`` (``null`` in the recording, never a made-up figure) and the reason is
kept once in :meth:`Nvml.problems` for the caller to turn into ``info`` findings.

The binding is the ``pynvml`` module of the ``nvidia-ml-py`` distribution,
injectable so tests can fake it at that boundary.

Row written by :class:`GpuSampler` (one per tick, ``samples/gpu.jsonl``)::

    {"t": epoch_s, "gpus": [{"index": int,            # NVML index (as nvidia-smi)
                             "name": str | null,
                             "util_pct": float | null, # busy % over NVML's last period
                             "mem_used_mib": float | null,
                             "mem_total_mib": float | null,
                             "power_w": float | null,
                             "sm_clock_mhz": int | null,
                             "pcie_tx_kib_s": int | null,  # only on ticks it was measured
                             "pcie_rx_kib_s": int | null,
                             "proc_mem_mib": float | null, # the training tree's memory
                             "lost": bool}]}

A lost GPU keeps its ``index``, ``name`` and ``mem_total_mib`` (read at start);
its measured fields are null.
"""

from __future__ import annotations

import os
import string
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpudoctor.samplers.base import RowWriter, Sampler

_MIB = 1024 * 1024

#: What each per-GPU query measures, for the one-line problem messages.
_FIELD_OF = {
    "nvmlDeviceGetUtilizationRates": "utilization",
    "nvmlDeviceGetMemoryInfo": "memory",
    "nvmlDeviceGetPowerUsage": "power",
    "nvmlDeviceGetClockInfo": "SM clock",
    "nvmlDeviceGetPcieThroughput": "PCIe throughput",
    "nvmlDeviceGetComputeRunningProcesses": "per-process memory",
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetUUID": "UUID",
}


def _error_class_name(code_name: str) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` -> ``NVMLError_GpuIsLost``, as pynvml names them."""
    suffix = code_name.replace("NVML_ERROR_", "")
    return "NVMLError_" + string.capwords(suffix, "_").replace("_", "")


def _to_str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """One door to NVML for the GPUs the training process can see.

    ``init()`` must succeed before any query. GPUs are keyed by their NVML index
    (the one ``nvidia-smi`` shows). Which GPUs are visible follows
    ``CUDA_VISIBLE_DEVICES`` of ``env`` (default ``os.environ``): integer indices
    or ``GPU-`` UUID (prefixes), with CUDA's rule that an entry naming no GPU
    hides it and every entry after it. Indices are taken in NVML (PCI) order.
    """

    def __init__(self, binding: Any = None, env: Mapping[str, str] | None = None) -> None:
        self._binding = binding
        self._env = os.environ if env is None else env
        self.reason: str | None = None
        self._initialized = False
        self._handles: dict[int, Any] = {}
        self._info: dict[int, dict[str, Any]] = {}
        self._lost: set[int] = set()
        self._unsupported: set[tuple[str, int | None]] = set()
        self._reported: set[tuple[str, int | None]] = set()
        self._problems: list[str] = []
        self._all_uuids: list[str | None] | None = None

    # -- lifecycle ---------------------------------------------------------

    def init(self) -> bool:
        """Start NVML and find the visible GPUs; False (and ``reason``) if there are none."""
        if self._initialized:
            return True
        if self._binding is None:
            try:
                import pynvml
            except ImportError as exc:
                return self._fail(f"nvidia-ml-py is not installed ({exc})")
            self._binding = pynvml
        b = self._binding
        try:
            b.nvmlInit()
        except b.NVMLError as exc:
            return self._fail(self._init_reason(exc))
        self._initialized = True
        count = self.query("nvmlDeviceGetCount")
        if count is None:
            return self._fail("NVML could not count the GPUs")
        indices = self._visible_indices(int(count))
        for index in indices:
            handle = self.query("nvmlDeviceGetHandleByIndex", index, gpu=index)
            if handle is not None:
                self._handles[index] = handle
                self._info[index] = self._static_info(index)
        if not self._handles:
            visible = self._env.get("CUDA_VISIBLE_DEVICES")
            if count == 0:
                why = "NVML found no GPU"
            elif visible is not None and not indices:
                why = f"CUDA_VISIBLE_DEVICES={visible!r} leaves no GPU visible to the training"
            else:
                why = "NVML could not open any visible GPU"
            return self._fail(why)
        return True

    def shutdown(self) -> None:
        """Release NVML; cached names and totals stay readable. Safe to call twice."""
        if self._initialized:
            self._initialized = False
            self.query("nvmlShutdown")

    def _fail(self, why: str) -> bool:
        self.reason = f"{why}; GPU figures are null, sampling the host only"
        self._problems.append(self.reason)
        self.shutdown()
        self._handles.clear()
        return False

    def _init_reason(self, exc: BaseException) -> str:
        if self._is(exc, "LIBRARY_NOT_FOUND"):
            return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
        if self._is(exc, "DRIVER_NOT_LOADED"):
            return "the NVIDIA driver is not loaded"
        if self._is(exc, "LIB_RM_VERSION_MISMATCH"):
            return ("NVIDIA driver/library version mismatch (NVML and the loaded kernel driver differ: "
                    "was the driver updated without a reboot?)")
        return f"nvmlInit failed: {exc}"

    def _visible_indices(self, count: int) -> list[int]:
        raw = self._env.get("CUDA_VISIBLE_DEVICES")
        if raw is None:
            return list(range(count))
        chosen: list[int] = []
        for token in (t.strip() for t in raw.split(",")):
            index = self._match_visible(token, count)
            if index is None:
                if token:
                    self._problems.append(
                        f"CUDA_VISIBLE_DEVICES entry {token!r} names no GPU index or GPU UUID "
                        "here; like CUDA, it and the entries after it are ignored"
                    )
                break
            if index not in chosen:
                chosen.append(index)
        return chosen

    def _match_visible(self, token: str, count: int) -> int | None:
        if token.isdigit():
            return int(token) if int(token) < count else None
        if not token.startswith("GPU-"):
            return None
        if self._all_uuids is None:
            self._all_uuids = [self._uuid_at(i) for i in range(count)]
        matches = [i for i, u in enumerate(self._all_uuids) if u and u.startswith(token)]
        return matches[0] if len(matches) == 1 else None

    def _uuid_at(self, index: int) -> str | None:
        handle = self.query("nvmlDeviceGetHandleByIndex", index, gpu=index)
        uuid = None if handle is None else self.query("nvmlDeviceGetUUID", handle, gpu=index)
        return None if uuid is None else _to_str(uuid)

    def _static_info(self, index: int) -> dict[str, Any]:
        handle = self._handles[index]
        name = self.query("nvmlDeviceGetName", handle, gpu=index)
        uuid = self.query("nvmlDeviceGetUUID", handle, gpu=index)
        mem = self.query("nvmlDeviceGetMemoryInfo", handle, gpu=index)
        return {
            "name": None if name is None else _to_str(name),
            "uuid": None if uuid is None else _to_str(uuid),
            "memory_total_mib": None if mem is None else round(mem.total / _MIB, 1),
        }

    # -- the one door -------------------------------------------------------

    def query(self, func_name: str, *args: Any, default: Any = None, gpu: int | None = None) -> Any:
        """Call ``binding.<func_name>(*args)``; NVML errors become ``default``.

        ``gpu`` (the NVML index) attributes the call; it is inferred when
        ``args[0]`` is a cached handle. NotSupported (or a function this driver
        or binding lacks) is reported once per (function, GPU) and not asked
        again; GpuIsLost/Unknown mark the GPU lost; other NVML errors are
        reported once per (function, GPU). Non-NVML exceptions propagate.
        """
        if gpu is None and args:
            gpu = next((i for i, h in self._handles.items() if h is args[0]), None)
        if (func_name, gpu) in self._unsupported or gpu in self._lost:
            return default
        b = self._binding
        func = getattr(b, func_name, None)
        if func is None:
            self._mark_unsupported(func_name, gpu, "this nvidia-ml-py has no such function")
            return default
        try:
            return func(*args)
        except b.NVMLError as exc:
            self._on_error(func_name, gpu, exc)
            return default

    def _is(self, exc: BaseException, code_name: str) -> bool:
        """True if ``exc`` is the binding's error for ``NVML_ERROR_<code_name>``."""
        b = self._binding
        cls = getattr(b, _error_class_name("NVML_ERROR_" + code_name), None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
        code = getattr(b, "NVML_ERROR_" + code_name, None)
        return code is not None and getattr(exc, "value", None) == code

    def _on_error(self, func_name: str, gpu: int | None, exc: BaseException) -> None:
        if self._is(exc, "NOT_SUPPORTED") or self._is(exc, "FUNCTION_NOT_FOUND"):
            self._mark_unsupported(func_name, gpu, str(exc))
        elif gpu is not None and (self._is(exc, "GPU_IS_LOST") or self._is(exc, "UNKNOWN")):
            self._lost.add(gpu)
            self._report_once(
                ("lost", gpu),
                f"{self._label(gpu)} is lost ({exc}, in {func_name}); its figures are null "
                "from then on (check dmesg for Xid errors)",
            )
        else:
            self._report_once(
                (func_name, gpu),
                f"{self._label(gpu)}: {func_name} failed ({exc}); that value is null",
            )

    def _mark_unsupported(self, func_name: str, gpu: int | None, why: str) -> None:
        self._unsupported.add((func_name, gpu))
        field = _FIELD_OF.get(func_name, func_name)
        self._report_once(
            (func_name, gpu),
            f"{self._label(gpu)}: {field} is not supported ({func_name}: {why}); recorded as null",
        )

    def _report_once(self, key: tuple[str, int | None], message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self._problems.append(message)

    def _label(self, gpu: int | None) -> str:
        if gpu is None:
            return "NVML"
        name = self._info.get(gpu, {}).get("name")
        return f"GPU {gpu} ({name})" if name else f"GPU {gpu}"

    # -- per-GPU figures ----------------------------------------------------

    @property
    def indices(self) -> list[int]:
        """NVML indices of the visible GPUs, in CUDA_VISIBLE_DEVICES order."""
        return list(self._handles)

    def is_lost(self, index: int) -> bool:
        """Cheap check: a lost GPU is not queried again (it needs a reset to return)."""
        return index in self._lost

    def _device(self, index: int, func_name: str, *args: Any) -> Any:
        return self.query(func_name, self._handles[index], *args, gpu=index)

    def name(self, index: int) -> str | None:
        name: str | None = self._info[index]["name"]
        return name

    def uuid(self, index: int) -> str | None:
        uuid: str | None = self._info[index]["uuid"]
        return uuid

    def memory_total_mib(self, index: int) -> float | None:
        """Read once at init: the total does not change during a run."""
        total: float | None = self._info[index]["memory_total_mib"]
        return total

    def utilization_pct(self, index: int) -> float | None:
        util = self._device(index, "nvmlDeviceGetUtilizationRates")
        return None if util is None else float(util.gpu)

    def memory_used_mib(self, index: int) -> float | None:
        mem = self._memory_v2(index)
        if mem is None:
            mem = self._device(index, "nvmlDeviceGetMemoryInfo")
        return None if mem is None else round(mem.used / _MIB, 1)

    def _memory_v2(self, index: int) -> Any:
        """``nvmlDeviceGetMemoryInfo`` in its version 2, as nvidia-smi reads it: version 1's ``used``
        counts the driver's reserved memory too (614 MiB more than nvidia-smi on an H200, driver
        580: bench/gpu_check.py). None where the binding or the driver has no version 2 (then
        version 1 is read, as before); asked once per GPU."""
        version = getattr(self._binding, "nvmlMemory_v2", None)
        key = ("nvmlDeviceGetMemoryInfo_v2", index)
        if version is None or key in self._unsupported or index in self._lost:
            return None
        try:
            return self._binding.nvmlDeviceGetMemoryInfo(self._handles[index], version)
        except TypeError:  # an nvidia-ml-py whose call takes no version
            self._unsupported.add(key)
        except self._binding.NVMLError as exc:
            if not (self._is(exc, "NOT_SUPPORTED") or self._is(exc, "FUNCTION_NOT_FOUND")
                    or self._is(exc, "ARGUMENT_VERSION_MISMATCH")):
                self._on_error("nvmlDeviceGetMemoryInfo", index, exc)
                return None
            self._unsupported.add(key)
        return None

    def power_w(self, index: int) -> float | None:
        milliwatts = self._device(index, "nvmlDeviceGetPowerUsage")
        return None if milliwatts is None else milliwatts / 1000.0

    def sm_clock_mhz(self, index: int) -> int | None:
        mhz = self._device(index, "nvmlDeviceGetClockInfo", self._binding.NVML_CLOCK_SM)
        return None if mhz is None else int(mhz)

    def pcie_tx_kib_s(self, index: int) -> int | None:
        """Blocks ~20 ms: NVML counts bytes over a 20 ms window."""
        counter = self._binding.NVML_PCIE_UTIL_TX_BYTES
        kib_s = self._device(index, "nvmlDeviceGetPcieThroughput", counter)
        return None if kib_s is None else int(kib_s)

    def pcie_rx_kib_s(self, index: int) -> int | None:
        """Blocks ~20 ms, like :meth:`pcie_tx_kib_s`."""
        counter = self._binding.NVML_PCIE_UTIL_RX_BYTES
        kib_s = self._device(index, "nvmlDeviceGetPcieThroughput", counter)
        return None if kib_s is None else int(kib_s)

    def process_memory_mib(self, index: int, pids: Collection[int]) -> float | None:
        """GPU memory held by ``pids`` on this GPU.

        0.0 only when NVML lists no compute process at all; None when it lists
        processes but none of ``pids`` (another job's, or PIDs from another PID
        namespace in a container) or hides their usage (``usedGpuMemory`` None).
        """
        procs = self._device(index, "nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return None
        if not procs:
            return 0.0
        used = [p.usedGpuMemory for p in procs if p.pid in pids]
        known: list[float] = [u for u in used if u is not None]  # pynvml: no stubs
        if not known:
            return None
        return round(sum(known) / _MIB, 1)

    def describe_gpus(self) -> list[dict[str, Any]]:
        """``[{"index", "name", "memory_total_mib", "uuid"}]`` for report ``run.gpus``."""
        return [
            {"index": i, **{k: info[k] for k in ("name", "memory_total_mib", "uuid")}}
            for i, info in self._info.items()
        ]

    def problems(self) -> list[str]:
        """One-line messages (init failure, unsupported fields, lost GPUs), oldest first."""
        return list(self._problems)


class GpuSampler(Sampler):
    """Samples every visible GPU each tick; see the module docstring for the row.

    ``pids_provider`` gives the training process tree (e.g.
    :meth:`HostSampler.pids`) for ``proc_mem_mib``; without it that field is null.
    PCIe throughput blocks ~20 ms per counter, so it is read for at most
    ``pcie_gpus_per_tick`` GPUs per tick and each GPU at most every
    ``pcie_interval_s``; on other ticks those fields are null (not measured).
    The sampler owns ``nvml``: :meth:`stop` shuts it down.
    """

    name = "gpu"

    def __init__(
        self,
        nvml: Nvml,
        writer: RowWriter | None,
        interval_s: float = 0.1,
        pids_provider: Callable[[], set[int]] | None = None,
        pcie_interval_s: float = 1.0,
        pcie_gpus_per_tick: int = 1,
    ) -> None:
        super().__init__(writer, interval_s)
        self.nvml = nvml
        self.pids_provider = pids_provider
        self.pcie_interval_s = pcie_interval_s
        self.pcie_gpus_per_tick = pcie_gpus_per_tick
        self._pcie_due: dict[int, float] = {}

    def sample(self) -> dict[str, Any] | None:
        pids = self.pids_provider() if self.pids_provider is not None else None
        pcie_now = self._pcie_turns()
        return {"gpus": [self._gpu_row(i, pids, i in pcie_now) for i in self.nvml.indices]}

    def _pcie_turns(self) -> set[int]:
        """The GPUs whose PCIe counters are read this tick: longest-waiting first."""
        now = time.monotonic()
        due = [i for i in self.nvml.indices if self._pcie_due.get(i, 0.0) <= now]
        due.sort(key=lambda i: self._pcie_due.get(i, 0.0))
        chosen = set(due[: self.pcie_gpus_per_tick])
        for i in chosen:
            self._pcie_due[i] = now + self.pcie_interval_s
        return chosen

    def _gpu_row(self, index: int, pids: set[int] | None, pcie: bool) -> dict[str, Any]:
        nvml = self.nvml
        row: dict[str, Any] = {
            "index": index,
            "name": nvml.name(index),
            "util_pct": nvml.utilization_pct(index),
            "mem_used_mib": nvml.memory_used_mib(index),
            "mem_total_mib": nvml.memory_total_mib(index),
            "power_w": nvml.power_w(index),
            "sm_clock_mhz": nvml.sm_clock_mhz(index),
            "pcie_tx_kib_s": nvml.pcie_tx_kib_s(index) if pcie else None,
            "pcie_rx_kib_s": nvml.pcie_rx_kib_s(index) if pcie else None,
            "proc_mem_mib": None if pids is None else nvml.process_memory_mib(index, pids),
        }
        row["lost"] = nvml.is_lost(index)
        return row

    def describe_gpus(self) -> list[dict[str, Any]]:
        return self.nvml.describe_gpus()

    def problems(self) -> list[str]:
        return self.nvml.problems()

    def stop(self) -> None:
        super().stop()
        self.nvml.shutdown()
