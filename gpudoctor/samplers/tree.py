"""One process tree watched from outside, kept as running figures: peak memory and GPU busy.

A sweep trial needs three figures of its worker, not a recording: the peak host
memory of its tree, the tree's peak GPU memory and the GPU's busy fraction over
the steady-state windows. This is a :class:`~gpudoctor.samplers.base.Sampler`
like the host and GPU samplers (same thread, pacing and once-per-error record);
its rows go to ``writer`` when one is given and are folded into those figures
either way.

Row (one per tick)::

    {"t": epoch_s, "rss_mib": float,          # tree sum (forked workers share pages:
                                               # an upper bound, as in the run report)
     "util_pct": float | null,                 # first visible GPU, NVML
     "gpu_mem_mib": float | null}              # the tree's processes on it, NVML
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from gpudoctor.processes.proctree import ProcTree
from gpudoctor.samplers.base import RowWriter, Sampler
from gpudoctor.samplers.nvml import Nvml

_MIB = 1024 * 1024


class TreeSampler(Sampler):
    """Samples ``pid`` and its children every ``interval_s``; NVML through ``nvml`` when given."""

    name = "tree"

    def __init__(
        self,
        pid: int,
        nvml: Nvml | None = None,
        interval_s: float = 0.25,
        writer: RowWriter | None = None,
    ) -> None:
        super().__init__(writer, interval_s)
        self.pid = pid
        self.nvml = nvml
        self.peak_rss_mib = 0.0
        self.peak_gpu_mem_mib: float | None = None
        self.gpu_util: list[tuple[float, float]] = []  # (epoch s, busy %)
        self._procs: ProcTree | None = None

    def __enter__(self) -> TreeSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample(self) -> dict[str, Any] | None:
        pids, rss_mib = self._tree()
        if not pids:
            return None  # the worker has exited (or not yet started): nothing to read
        self.peak_rss_mib = max(self.peak_rss_mib, rss_mib)
        row: dict[str, Any] = {"rss_mib": round(rss_mib, 1), "util_pct": None, "gpu_mem_mib": None}
        if self.nvml is not None:
            for index in self.nvml.indices[:1]:  # a replay trains on the first visible GPU
                util = self.nvml.utilization_pct(index)
                if util is not None:
                    row["util_pct"] = float(util)
                    self.gpu_util.append((time.time(), float(util)))  # when NVML answered
                mem = self.nvml.process_memory_mib(index, pids)
                if mem is not None:
                    row["gpu_mem_mib"] = float(mem)
                    self.peak_gpu_mem_mib = max(self.peak_gpu_mem_mib or 0.0, float(mem))
        return row

    def _tree(self) -> tuple[set[int], float]:
        if self._procs is None or self._procs.root is None:  # not started yet: look again next tick
            self._procs = ProcTree(self.pid)
        try:
            procs = self._procs.refresh()
        except psutil.Error:
            return set(), 0.0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # a worker that exited between the listing and the read
        return {p.pid for p in procs}, total / _MIB

    def gpu_busy(self, start_t: float, end_t: float) -> float | None:
        """Mean NVML busy fraction between two epoch times (None without samples)."""
        values = [u for t, u in self.gpu_util if start_t <= t <= end_t]
        return sum(values) / len(values) / 100.0 if values else None


def open_nvml() -> Nvml | None:
    """An initialised :class:`Nvml`, or None where there is no GPU (the reason is not an error here)."""
    nvml = Nvml()
    return nvml if nvml.init() else None
