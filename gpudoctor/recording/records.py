"""One process's events after the one parse: a typed collection per kind.

:func:`gpudoctor.recording.read.read_events` checks each line and hands it to :meth:`Records.add`,
the only place that looks at an event's ``k``; every reader after it (the process view, the GPU
clock, replay's facts, sweep's windows, the tables, the notes) takes these fields, never a list of
dicts to filter again. The records are the :mod:`gpudoctor.core.events` TypedDicts themselves,
as parsed: the format is declared once there (the hooks write it, validate derives its checks from
it), and a record costs no copy, so the memory budget charged on the parsed line stays true.

Where a kind may come more than once, the rule is here, once: settings read at a process's start
(``proc``, ``torch_cfg``, ``model``, ``loader`` order, ``ddp``, ``accelerator``,
``lightning_checkpoint``, ``gpu_clock``) keep the first; what the training says it will do
(``trainer``, ``plan``) keeps the last, the Trainer built last being the one that trains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from gpudoctor.core.events import (
    NO_BATCH_WAIT,
    AcceleratorEvent,
    AppliedEvent,
    BatchEvent,
    CliEvent,
    CommEvent,
    CounterEvent,
    CudaMemEvent,
    DdpEvent,
    GpuClockEvent,
    GpuSaveEvent,
    GpuStepEvent,
    GpuWaitEvent,
    HookErrorEvent,
    LightningCheckpointEvent,
    LoaderEvent,
    MapCacheEvent,
    ModelEvent,
    PlanEvent,
    ProcEvent,
    ProfilerEvent,
    TorchCfgEvent,
    TrackerEvent,
    TrainerEvent,
    UncaughtEvent,
)
from gpudoctor.recording.validate import is_duration, is_time


@dataclass
class LoopData:
    """A process's steps and spans, compact: a day at 2 steps/s is ~170k of each."""

    steps: list[float] = field(default_factory=list)  # ``t`` of each ``step`` event, file order
    step_dt_s: float = 0.0  # the optimizer steps' own seconds (``dt`` of the step events), summed
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # category -> (start, end)
    span_s: dict[str, dict[str, float]] = field(default_factory=dict)  # category -> name -> seconds
    no_batch_waits: int = 0  # data_wait spans named NO_BATCH_WAIT: waits, not batches

    def __bool__(self) -> bool:
        return bool(self.steps or self.spans)

    def add_step(self, t: float, dt: float | None) -> None:
        self.steps.append(float(t))
        if dt is not None and not isinstance(dt, bool) and dt > 0:
            self.step_dt_s += float(dt)

    def add_span(self, c: str, t0: float, dt: float, name: str = "?") -> None:
        self.spans.setdefault(c, []).append((float(t0), float(t0) + float(dt)))
        per = self.span_s.setdefault(c, {})
        per[name] = per.get(name, 0.0) + float(dt)
        if name == NO_BATCH_WAIT:
            self.no_batch_waits += 1


@dataclass
class CounterSum:
    """``counter`` lines of one name on one side of the first step, summed (all the analysis reads).

    ``t`` is the latest line's, so "after the first step" reads as for the lines; CPU beside wall
    (newer writers) is summed over the lines that carried it, ``cpu_calls`` of them.
    """

    name: str
    t: float
    calls: int = 0
    s: float = 0.0
    cpu: float = 0.0
    tcpu: float = 0.0
    rdelay: float = 0.0
    cpu_calls: int = 0

    @property
    def cpu_timed(self) -> bool:
        """Every call of the sum carried its CPU (a writer upgraded mid-run has no one ratio)."""
        return self.cpu_calls > 0 and self.cpu_calls == self.calls


@dataclass
class Records:
    """Every kind this version reads, typed, for one process (see the module's rules on repeats)."""

    loop: LoopData = field(default_factory=LoopData)  # steps and spans, compact
    proc: ProcEvent | None = None
    first_step: float | None = None  # the earliest ``first_step``
    exit_t: float | None = None  # the last ``exit``
    batches: list[BatchEvent] = field(default_factory=list)
    loaders: list[LoaderEvent] = field(default_factory=list)
    torch_cfg: TorchCfgEvent | None = None
    model: ModelEvent | None = None
    trainer: TrainerEvent | None = None
    plan: PlanEvent | None = None  # ``plan``, or ``hf_plan`` as recordings before 0.1 name it
    lightning_checkpoint: LightningCheckpointEvent | None = None
    accelerator: AcceleratorEvent | None = None
    ddp: DdpEvent | None = None
    comm: list[CommEvent] = field(default_factory=list)
    counters: list[CounterSum] = field(default_factory=list)  # per (name, side of the first step)
    profiler: list[ProfilerEvent] = field(default_factory=list)
    map_cache: list[MapCacheEvent] = field(default_factory=list)
    cli: list[CliEvent] = field(default_factory=list)
    uncaught: list[UncaughtEvent] = field(default_factory=list)
    hook_errors: list[HookErrorEvent] = field(default_factory=list)
    gpu_clock: GpuClockEvent | None = None
    gpu_steps: list[GpuStepEvent] = field(default_factory=list)
    gpu_waits: list[GpuWaitEvent] = field(default_factory=list)
    gpu_saves: list[GpuSaveEvent] = field(default_factory=list)
    applied: list[AppliedEvent] = field(default_factory=list)
    trackers: list[TrackerEvent] = field(default_factory=list)
    cuda_mem: list[CudaMemEvent] = field(default_factory=list)  # the CUDA allocator at step ends
    # Times of the kept lines (``t``, and ``t0 + dt``; summed counters at their ``t``): a process's
    # life where it wrote no ``proc``/``exit``, and how far its recording reached.
    t_lo: float | None = None
    t_hi: float | None = None
    lines: int = 0  # lines taken, of every kind
    _raw_counters: list[CounterEvent] = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        """Anything kept: a process with no line of any kind read is not one to analyse."""
        return self.lines > 0 or bool(self.loop)

    def add(self, e: dict[str, Any]) -> None:
        """One checked line (``validate.clean_event``) into its kind's field: the one dispatch on ``k``."""
        self._extent(e)
        self.lines += 1
        kind = e["k"]
        if kind in _FIRST:
            if getattr(self, _FIRST[kind]) is None:
                setattr(self, _FIRST[kind], e)
        elif kind in _LAST:
            setattr(self, _LAST[kind], e)
        elif kind in _ALL:
            getattr(self, _ALL[kind]).append(e)
        elif kind == "first_step":
            t = float(e["t"])
            self.first_step = t if self.first_step is None else min(self.first_step, t)
        elif kind == "exit":
            self.exit_t = float(e["t"])
        elif kind == "counter":
            self._raw_counters.append(cast(CounterEvent, e))
        elif kind == "step":
            self.loop.add_step(e["t"], e.get("dt"))
        elif kind == "span":
            self.loop.add_span(e["c"], e["t0"], e["dt"], e.get("name", "?"))

    def _extent(self, e: dict[str, Any]) -> None:
        t: Any = e.get("t")
        t0: Any = e.get("t0")
        dt: Any = e.get("dt")
        times = [float(t)] if is_time(t) else []
        if is_time(t0):  # an event of a newer kind may carry anything in dt
            times.append(float(t0) + (float(dt) if is_duration(dt) else 0.0))
        if e["k"] in ("counter", "step", "span"):
            return  # counters count at their sums' times (finish); steps and spans in the loop
        self._widen(times)

    def _widen(self, times: Iterable[float]) -> None:
        for t in times:
            self.t_lo = t if self.t_lo is None else min(self.t_lo, t)
            self.t_hi = t if self.t_hi is None else max(self.t_hi, t)

    def finish(self) -> Records:
        """Counters summed per name and side of the first step, once every line is in."""
        first = self.first_step
        sums: dict[tuple[str, bool], CounterSum] = {}
        for c in self._raw_counters:
            key = (c["name"], first is not None and c["t"] > first)
            total = sums.get(key)
            if total is None:
                sums[key] = total = CounterSum(name=c["name"], t=c["t"])
            else:
                total.t = max(total.t, c["t"])
            total.calls += c["calls"]
            total.s += c["s"]
            cpu = c.get("cpu")
            if cpu is not None:
                total.cpu += cpu
                total.tcpu += c.get("tcpu") or 0.0
                total.rdelay += c.get("rdelay") or 0.0
                total.cpu_calls += c["calls"]
        self._raw_counters = []
        self.counters = list(sums.values())
        self._widen(c.t for c in self.counters)
        return self

    def extent(self) -> tuple[float, float] | None:
        """(first, last) time of every kept line, steps and spans included."""
        times = [t for t in (self.t_lo, self.t_hi) if t is not None]
        if self.loop.steps:
            times += [min(self.loop.steps), max(self.loop.steps)]
        for spans in self.loop.spans.values():
            if spans:
                times += [min(a for a, _ in spans), max(b for _, b in spans)]
        return (min(times), max(times)) if times else None


# kind -> field, by the rule the module's docstring says
_FIRST = {"proc": "proc", "torch_cfg": "torch_cfg", "model": "model", "ddp": "ddp", "accelerator": "accelerator",
          "lightning_checkpoint": "lightning_checkpoint", "gpu_clock": "gpu_clock"}
_LAST = {"trainer": "trainer", "plan": "plan", "hf_plan": "plan"}
_ALL = {"batch": "batches", "loader": "loaders", "comm": "comm", "profiler": "profiler", "map_cache": "map_cache",
        "cli": "cli", "uncaught": "uncaught", "hook_error": "hook_errors", "gpu_step": "gpu_steps",
        "gpu_wait": "gpu_waits", "gpu_save": "gpu_saves", "applied": "applied", "tracker": "trackers",
        "cuda_mem": "cuda_mem"}
