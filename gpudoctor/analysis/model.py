"""The parsed run: training processes, host and GPU figures, and SPEC sections."""

from __future__ import annotations

import copy
import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.analysis import trainings as tr
from gpudoctor.analysis.process import ProcessView, build_process_view, padding_summary, quantiles
from gpudoctor.analysis.sampled import load_stack_rows, sampled_records
from gpudoctor.common.numbers import num
from gpudoctor.core.schema import BREAKDOWN_KEYS
from gpudoctor.recording.records import Records
from gpudoctor.recording.store import Recording
from gpudoctor.samplers.pace import MAX_INTERVAL_S


@dataclass
class HostStats:
    cores: int
    cpu_total_pct: float | None  # whole machine, 0-100
    cpu_run_cores: float | None  # cores busy with the run's processes (1.0 = one core)
    iowait_pct: float | None
    read_mib_s: float | None
    disk_read_mib_s: float | None
    rss_max_mib: float | None
    samples: int
    mem_available_mib: float | None = None  # the least seen during the loop
    # Programs outside the run that kept cores busy during the loop: (command name, cores), busiest first
    others: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class GpuStats:
    count: int
    names: list[str]
    busy_fraction: float | None  # mean NVML utilization over the run's GPUs, 0-1
    busy_in_loop: float | None
    mem_used_max_mib: float | None
    mem_total_mib: float | None
    lost: list[int]


@dataclass
class Analysis:
    rec: Recording
    start: float
    end: float
    procs: list[ProcessView]
    host: HostStats
    gpu: GpuStats
    notes: list[str] = field(default_factory=list)
    # Training processes that ran at the same time, one list per training, in order (a wrapper
    # may run several in a row); each list sorted by rank. ``procs`` is all of them, in order.
    trainings: list[list[ProcessView]] = field(default_factory=list)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def primary(self) -> ProcessView | None:
        return self.procs[0] if self.procs else None

    @property
    def has_inprocess(self) -> bool:
        return bool(self.procs)

    @property
    def leads(self) -> list[ProcessView]:
        """Each training's lowest rank: whose steps count (ranks of one training step together)."""
        return [g[0] for g in self.trainings if g]

    def breakdown(self) -> dict[str, float | None]:
        """Mean over training processes; null slices when no process was hooked.

        Trainings in a row add up: each contributes its processes' mean seconds per slice.
        """
        if not self.procs:
            return {k: None for k in BREAKDOWN_KEYS}
        if len(self.trainings) <= 1:
            return {k: statistics.fmean(p.breakdown[k] for p in self.procs) for k in BREAKDOWN_KEYS}
        return {k: self._over_trainings(functools.partial(ProcessView.seconds, key=k)) for k in BREAKDOWN_KEYS}

    def _over_trainings(self, seconds: Callable[[ProcessView], float]) -> float:
        """Seconds per process, averaged within each training, summed over trainings, as a fraction."""
        return sum(statistics.fmean(seconds(p) for p in g) for g in self.trainings if g) / self.duration_s

    def share(self, key: str) -> float:
        value = self.breakdown().get(key)
        return float(value) if value is not None else 0.0

    def shares(self) -> dict[str, float | None]:
        tok = None
        if len(self.trainings) > 1:
            tok = self._over_trainings(lambda p: p.tokenize_s)
        elif self.procs:
            tok = statistics.fmean(p.tokenize_s / p.wall_s for p in self.procs)
        cpu = None
        if self.host.cpu_run_cores is not None and self.host.cores:
            cpu = min(1.0, self.host.cpu_run_cores / self.host.cores)
        return {"tokenization": tok, "gpu_busy": self.gpu.busy_fraction, "cpu_busy": cpu}

    def padding(self) -> dict[str, Any]:
        if "padding" not in self._cache:  # sorts every row length seen: once per report
            self._cache["padding"] = padding_summary([b for p in self.procs for b in p.batches])
        return copy.deepcopy(self._cache["padding"])

    def steps(self) -> dict[str, Any]:
        if "steps" not in self._cache:  # sorts every step interval: once per report
            self._cache["steps"] = self._steps()
        return copy.deepcopy(self._cache["steps"])

    def _steps(self) -> dict[str, Any]:
        leads = self.leads or self.procs[:1]
        if not leads:
            return {"count": 0, "first_step_at_s": None, "step_time_s": {"p50": None, "p90": None}}
        first = next((p.first_step for p in leads if p.first_step is not None), None)
        return {
            "count": sum(len(p.step_times) for p in leads),
            "first_step_at_s": (first - self.start) if first is not None else None,
            # within each training: the pause between two trainings is not a step
            "step_time_s": quantiles([dt for p in leads for dt in p.step_intervals_s()]),
        }


def analyze(rec: Recording) -> Analysis:
    start = float(rec.meta.get("start_time") or 0.0)
    end = float(rec.meta.get("end_time") or start)
    groups = _training_processes(rec, start, end)
    procs = [p for g in groups for p in g]
    leads = [g[0] for g in groups if g]
    host = _host_stats(rec, leads)
    gpu = _gpu_stats(rec, leads)
    return Analysis(rec=rec, start=start, end=end, procs=procs, host=host, gpu=gpu,
                    notes=list(rec.notes) + _hook_error_notes(rec, start), trainings=groups)


def _hook_error_notes(rec: Recording, start: float) -> list[str]:
    """What a hook that failed inside the training said (the training went on without it)."""
    notes = []
    for pid, records in sorted(rec.events.items()):
        for e in records.hook_errors:
            at = f"{float(e['t']) - start:.1f} s after launch" if isinstance(e["t"], float) else "at some point"
            what = f"{e['where']!s} ({e.get('message') or e.get('error') or 'an internal error'})"
            notes.append(
                f"in-process recording stopped in pid {pid} {at} after an internal error in {what}: "
                "in-process figures cover the time before"
                if e.get("vital") else
                f"the hook {what} was switched off in pid {pid} {at} after an internal error; "
                "the other figures are complete"
            )
    return notes


def _training_processes(rec: Recording, start: float, end: float) -> list[list[ProcessView]]:
    """The training processes (not DataLoader workers), grouped into trainings (see trainings.py)."""
    # Processes the hooks never reached (attach without a debugger) are seen through stack samples.
    events = {**sampled_records(load_stack_rows(rec.root, rec.clock), skip_pids=set(rec.events)), **rec.events}
    workers: dict[int, list[Records]] = {}
    for records in events.values():
        if records.proc is not None and records.proc.get("is_worker"):
            workers.setdefault(int(records.proc.get("ppid") or -1), []).append(records)
    lives: dict[int, tr.Lifetime] = {}
    for pid, records in events.items():
        if records.proc is not None and records.proc.get("is_worker"):
            continue
        loop = records.loop
        if records.first_step is not None or loop.steps or loop.spans.get("data_wait"):
            lives[pid] = tr.lifetime(records, start, end)
    groups = tr.group(lives)
    out = []
    for pids, (lo, hi) in zip(groups, tr.windows(groups, lives, start, end), strict=True):
        views = [build_process_view(pid, events[pid], lo, hi, workers.get(pid, [])) for pid in pids]
        out.append(sorted(views, key=lambda v: (v.rank, v.pid)))
    return out


def _in_window(rows: list[dict[str, Any]], lo: float, hi: float) -> list[dict[str, Any]]:
    return [r for r in rows if isinstance(r.get("t"), (int, float)) and lo <= r["t"] <= hi]


def time_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """Mean of a host row's rate figure, each row weighed by the seconds it covers.

    A row's rates are counter differences since the previous row, and the host
    sampler's interval changes (it follows the step time and slows on a saturated
    host: samplers.pace), so an unweighted mean would favour the fast-sampled stretches.
    A gap longer than the sampler's longest interval is rows left out between (``rows``
    from several windows), so a row never weighs more than that interval.
    """
    timed = sorted(((r["t"], r.get(key)) for r in rows if num(r.get("t")) is not None), key=lambda tv: tv[0])
    pairs: list[tuple[float, float]] = []
    for i, (t, value) in enumerate(timed):
        if not isinstance(value, (int, float)):
            continue
        gap = t - timed[i - 1][0] if i else (timed[1][0] - t if len(timed) > 1 else 1.0)
        pairs.append((float(value), min(max(gap, 0.0), MAX_INTERVAL_S)))
    if not pairs:
        return None
    weight = sum(w for _, w in pairs)
    if weight <= 0:
        return statistics.fmean(v for v, _ in pairs)
    return sum(v * w for v, w in pairs) / weight


def _loop_window(leads: list[ProcessView], start: float, end: float) -> tuple[float, float]:
    """From the first training loop's first step to the last one's end (the whole run if none)."""
    looped = [p for p in leads if p.first_step is not None]
    if not looped:
        return start, end
    return looped[0].first_step or start, (looped[-1].loop_end or end)


def _host_stats(rec: Recording, leads: list[ProcessView]) -> HostStats:
    cores = int((rec.meta.get("host") or {}).get("cpu_count") or 0)
    lo, hi = _loop_window(leads, rec.start_time or 0.0, rec.end_time or 0.0)
    rows = _in_window(rec.host, lo, hi) or rec.host
    if not cores and rows and rows[0].get("cpu_percore_pct"):
        cores = len(rows[0]["cpu_percore_pct"])
    run_pct = time_mean(rows, "cpu_proc_pct")
    rss = [v for r in rec.host if isinstance(v := r.get("rss_mib"), (int, float))]
    return HostStats(
        cores=cores,
        cpu_total_pct=time_mean(rows, "cpu_total_pct"),
        cpu_run_cores=(run_pct / 100.0) if run_pct is not None else None,
        iowait_pct=time_mean(rows, "iowait_pct"),
        read_mib_s=time_mean(rows, "read_mib_s"),
        disk_read_mib_s=time_mean(rows, "disk_read_mib_s"),
        rss_max_mib=max(rss) if rss else None,
        samples=len(rec.host),
        mem_available_mib=min(mem) if (mem := [float(r["mem_available_mib"]) for r in rows
                                                if isinstance(r.get("mem_available_mib"), (int, float))]) else None,
        others=_other_programs(rows),
    )


def _other_programs(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Mean cores each other program kept busy over the scans in ``rows`` (absent from a scan: 0)."""
    scans = [r["others"] for r in rows if isinstance(r.get("others"), list)]
    if not scans:
        return []
    total: dict[str, float] = {}
    for scan in scans:
        for o in scan:
            total[o["name"]] = total.get(o["name"], 0.0) + float(o["pct"]) / 100.0
    return sorted(((name, s / len(scans)) for name, s in total.items()), key=lambda x: -x[1])


def _gpu_stats(rec: Recording, leads: list[ProcessView]) -> GpuStats:
    described = (rec.meta.get("gpus") or [])
    if not rec.gpu and not described:
        return GpuStats(0, [], None, None, None, None, [])
    used = _gpus_used(rec)
    lo, hi = _loop_window(leads, rec.start_time or 0.0, rec.end_time or 0.0)
    per_row = []
    loop_rows = []
    mem_used: list[float] = []
    mem_total: float | None = None
    lost: set[int] = set()
    names: dict[int, str] = {int(g["index"]): str(g.get("name")) for g in described if "index" in g}
    for row in rec.gpu:
        utils = []
        for g in row.get("gpus", []):
            idx = int(g.get("index", -1))
            if used and idx not in used:
                continue
            if g.get("lost"):
                lost.add(idx)
                continue
            names.setdefault(idx, str(g.get("name")))
            if g.get("util_pct") is not None:
                utils.append(float(g["util_pct"]))
            if g.get("mem_used_mib") is not None:
                mem_used.append(float(g["mem_used_mib"]))
            if g.get("mem_total_mib") is not None:
                mem_total = float(g["mem_total_mib"])
        if utils:
            value = statistics.fmean(utils) / 100.0
            per_row.append(value)
            if lo <= row.get("t", 0) <= hi:
                loop_rows.append(value)
    count = len(used) if used else len(names)
    return GpuStats(
        count=count,
        names=[names[i] for i in sorted(names) if not used or i in used],
        busy_fraction=statistics.fmean(per_row) if per_row else None,
        busy_in_loop=statistics.fmean(loop_rows) if loop_rows else None,
        mem_used_max_mib=max(mem_used) if mem_used else None,
        mem_total_mib=mem_total,
        lost=sorted(lost),
    )


def _gpus_used(rec: Recording) -> set[int]:
    """GPUs where the run's processes held memory; empty set = unknown (use all)."""
    used: set[int] = set()
    for row in rec.gpu:
        for g in row.get("gpus", []):
            if g.get("proc_mem_mib"):
                used.add(int(g.get("index", -1)))
    return used
