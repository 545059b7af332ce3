"""Watch a trial's process tree from outside: host memory and, with a GPU, NVML.

Peak host memory is the tree's summed RSS (forked DataLoader workers share pages
with the main process, so it is an upper bound, as in the run report). GPU busy
and the tree's GPU memory come through the one NVML door
(:class:`gpudoctor.samplers.nvml.Nvml`); without a GPU they stay None.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil

_MIB = 1024 * 1024


class TreeMonitor:
    """Samples ``pid`` and its children every ``interval_s`` on a daemon thread."""

    def __init__(self, pid: int, interval_s: float = 0.25, nvml: Any = None) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.nvml = nvml
        self.peak_rss_mib = 0.0
        self.peak_gpu_mem_mib: float | None = None
        self.gpu_util: list[tuple[float, float]] = []  # (epoch s, busy %)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="gpudoctor-sweep-monitor", daemon=True
        )

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            pids = self._sample_host()
            if self.nvml is not None and pids:
                self._sample_gpu(pids)
            self._stop.wait(self.interval_s)

    def _sample_host(self) -> set[int]:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return set()
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # a worker that exited between the listing and the read
        self.peak_rss_mib = max(self.peak_rss_mib, total / _MIB)
        return {p.pid for p in procs}

    def _sample_gpu(self, pids: set[int]) -> None:
        now = time.time()
        for index in self.nvml.indices[:1]:  # the replay trains on the first visible GPU
            util = self.nvml.utilization_pct(index)
            if util is not None:
                self.gpu_util.append((now, float(util)))
            mem = self.nvml.process_memory_mib(index, pids)
            if mem is not None:
                self.peak_gpu_mem_mib = max(self.peak_gpu_mem_mib or 0.0, float(mem))

    def gpu_busy(self, start_t: float, end_t: float) -> float | None:
        """Mean NVML busy fraction between two epoch times (None without samples)."""
        values = [u for t, u in self.gpu_util if start_t <= t <= end_t]
        return sum(values) / len(values) / 100.0 if values else None


def open_nvml() -> Any:
    """An initialised :class:`Nvml`, or None where there is no GPU (the reason is not an error here)."""
    from gpudoctor.samplers.nvml import Nvml

    nvml = Nvml()
    return nvml if nvml.init() else None
