"""What one training process did: its breakdown, steps, padding and loader cost."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import sub
from typing import Any, TypeVar

from gpudoctor.analysis import gpu_clock
from gpudoctor.analysis import timeline as tl
from gpudoctor.common import batchlengths
from gpudoctor.core.events import (
    COMMUNICATION,
    AcceleratorEvent,
    BatchEvent,
    CommEvent,
    DdpEvent,
    LightningCheckpointEvent,
    LoaderEvent,
    ModelEvent,
    PlanEvent,
    ProcEvent,
    ProfilerEvent,
    TorchCfgEvent,
    TrainerEvent,
)
from gpudoctor.core.schema import BREAKDOWN_KEYS
from gpudoctor.recording.records import CounterSum, Records

N = TypeVar("N", int, float)


@dataclass
class ProcessView:
    """Per-process figures, all derived from that process's events."""

    pid: int
    rank: int
    records: Records  # its events, typed once by the reader (recording/records.py)
    start: float
    end: float
    first_step: float | None = None
    step_times: list[float] = field(default_factory=list)
    optimizer_s: float = 0.0  # seconds inside optimizer.step (the step events' ``dt``): per step, not per token
    spans: dict[str, list[tl.Interval]] = field(default_factory=dict)
    span_names: dict[str, dict[str, float]] = field(default_factory=dict)
    # startup, data_wait, checkpoint and eval intervals; compute and other only as seconds in slice_s
    slices: dict[str, list[tl.Interval]] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)
    batches: list[BatchEvent] = field(default_factory=list)
    loaders: list[LoaderEvent] = field(default_factory=list)
    torch_cfg: TorchCfgEvent | None = None
    model: ModelEvent | None = None  # the first ``model`` event: config and parameter shape
    trainer: TrainerEvent | None = None  # the last Trainer built
    lightning_checkpoint: LightningCheckpointEvent | None = None  # the first ModelCheckpoint's settings
    accelerator: AcceleratorEvent | None = None  # the first Accelerator's settings
    ddp: DdpEvent | None = None  # the first DistributedDataParallel's settings (``ddp`` event)
    comm: list[CommEvent] = field(default_factory=list)  # ``comm`` events: collectives per step
    plan: PlanEvent | None = None
    tokenize_s: float = 0.0
    tokenize_in_loop_s: float = 0.0
    tokenize_calls: int = 0
    fetch_s: float = 0.0
    fetch_calls: int = 0
    # CPU beside wall, over the calls whose counters carried it (0 calls: not measured, an older writer)
    fetch_timed_s: float = 0.0  # wall seconds of those calls
    fetch_cpu_s: float = 0.0  # process CPU (every thread) of those calls
    fetch_thread_cpu_s: float = 0.0  # the calling thread's CPU
    fetch_run_delay_s: float = 0.0  # the calling thread runnable, waiting for a core
    fetch_cpu_calls: int = 0
    fetch_in_workers: int = 0  # of fetch_calls, those made in DataLoader workers
    tokenize_timed_s: float = 0.0
    tokenize_cpu_s: float = 0.0
    tokenize_cpu_calls: int = 0
    n_data_waits: int = 0  # loader waits that delivered a batch (not the end-of-data one)
    profiler: list[ProfilerEvent] = field(default_factory=list)
    map_cache: list[str] = field(default_factory=list)  # per Dataset.map: "hit" | "miss" | "none"
    proc: ProcEvent = field(default_factory=lambda: ProcEvent(k="proc"))
    node: str | None = None  # a multi-node job's node (analysis/nodes.py), else None
    slice_s: dict[str, float] = field(default_factory=dict)  # seconds per slice, set with ``slices``
    # A CUDA run's GPU clock (analysis.gpu_timeline): then ``breakdown`` is on the GPU's seconds and
    # the host's own figures are kept here.
    gpu_clock: gpu_clock.ClockView | None = None
    host_checkpoint_spans: list[tl.Interval] | None = None  # a CUDA run's saves as the host timed them
    host_breakdown: dict[str, float] = field(default_factory=dict)
    host_slice_s: dict[str, float] = field(default_factory=dict)
    host_tokenize_in_loop_s: float | None = None
    _intervals: list[float] | None = field(default=None, repr=False)

    @property
    def wall_s(self) -> float:
        return max(self.end - self.start, 1e-9)

    def seconds(self, key: str) -> float:
        return self.slice_s[key] if key in self.slice_s else tl.total(self.slices.get(key, []))

    def startup_parts(self) -> dict[str, float]:
        """What the startup slice was made of, in seconds: the heavy imports, model loading,
        dataset loading, dataset formatting/tokenizing (``map``), and the rest (building the
        model from a config, the script's own setup). Parts are measured before the first step
        and clipped to the slice, so they never sum past it."""
        total = self.seconds("startup")
        first = self.first_step if self.first_step is not None else self.end
        parts = {key: tl.total(tl.clip(tl.merge(self.spans.get(cat, [])), self.start, first))
                 for key, cat in (("imports_s", "imports"), ("model_load_s", "model_load"),
                                  ("data_load_s", "data_load"), ("format_s", "format"))}
        scale = min(1.0, total / s) if (s := sum(parts.values())) > 0 else 1.0
        parts = {k: v * scale for k, v in parts.items()}
        return {"total_s": total, **parts, "other_s": max(0.0, total - sum(parts.values()))}

    @cached_property
    def loop_end(self) -> float | None:
        """End of the training loop: the last step or batch wait (read once spans are in)."""
        ends = [max(self.step_times)] if self.step_times else []
        for key in ("data_wait", "loop"):  # "loop": the loop's extent seen by stack samples (attach)
            spans = self.spans.get(key, [])
            if spans:
                ends.append(max(b for _, b in spans))
        return max(ends) if ends else None

    def step_intervals_s(self) -> list[float]:
        if self._intervals is None:
            times = sorted(self.step_times)
            self._intervals = list(map(sub, times[1:], times))
        return list(self._intervals)


def build_process_view(pid: int, records: Records, start: float, end: float, workers: list[Records]) -> ProcessView:
    """The figures of process ``pid`` over [start, end]; ``workers``: its DataLoader workers' records."""
    proc = records.proc if records.proc is not None else ProcEvent(k="proc")
    rank = proc.get("rank")
    loop = records.loop
    view = ProcessView(
        pid=pid, rank=rank if isinstance(rank, int) else 0, records=records, start=start, end=end, proc=proc,
        first_step=records.first_step, step_times=list(loop.steps), optimizer_s=loop.step_dt_s,
        spans={c: list(iv) for c, iv in loop.spans.items()}, span_names={c: dict(n) for c, n in loop.span_s.items()},
        n_data_waits=len(loop.spans.get("data_wait", [])) - loop.no_batch_waits,
        batches=list(records.batches), loaders=list(records.loaders), torch_cfg=records.torch_cfg,
        model=records.model, trainer=records.trainer, lightning_checkpoint=records.lightning_checkpoint,
        accelerator=records.accelerator, ddp=records.ddp, comm=list(records.comm), plan=records.plan,
        profiler=list(records.profiler),
        map_cache=[m["state"] for m in records.map_cache if m["state"] in ("hit", "miss", "none")],
    )
    _apply_counters(view, records.counters, workers)
    compute_breakdown(view)
    _on_gpu_clock(view)
    return view


def _on_gpu_clock(view: ProcessView) -> None:
    """A CUDA run's breakdown on the GPU's seconds (waits cut to the GPU's idle), the host's kept."""
    clock = gpu_clock.clock_view(view.records)
    if clock is None:
        return
    view.gpu_clock = clock
    view.host_breakdown = dict(view.breakdown)
    view.host_slice_s = dict(view.slice_s)
    if clock.saves:  # a save costs the GPU its part only: the saving rule reads these spans too
        view.host_checkpoint_spans = view.spans.get("checkpoint", [])
        view.spans["checkpoint"] = gpu_clock.gpu_save_intervals(view.host_checkpoint_spans, clock)
    compute_breakdown(view, waits=gpu_clock.gpu_wait_intervals(view.spans.get("data_wait", []), clock))
    # A main-process tokenizer costs the GPU only the seconds it idles waiting for the batch: the
    # rest ran while the GPU was busy, and pre-tokenizing gives none of it back.
    view.host_tokenize_in_loop_s = view.tokenize_in_loop_s
    view.tokenize_in_loop_s = min(view.tokenize_in_loop_s, view.seconds("data_wait"))


def _apply_counters(view: ProcessView, counters: list[CounterSum], workers: list[Records]) -> None:
    """Tokenizer time of this process; batch production cost here or in its workers."""
    first = view.first_step
    loop_end = view.loop_end
    for c in counters:
        if c.name == "tokenize":
            view.tokenize_s += c.s
            view.tokenize_calls += c.calls
            if c.cpu_timed:
                view.tokenize_timed_s += c.s
                view.tokenize_cpu_s += c.cpu
                view.tokenize_cpu_calls += c.calls
            # Counter lines are flushed every ~0.5 s; attribute by flush time, and only
            # to the training loop (tokenizing after the last step is not in-loop).
            t = c.t
            if first is not None and first < t <= (loop_end if loop_end is not None else t) + 0.6:
                view.tokenize_in_loop_s += c.s
        elif c.name == "fetch":
            _add_fetch(view, c, worker=False)
    for worker in workers:
        for c in worker.counters:
            if c.name == "fetch":
                _add_fetch(view, c, worker=True)


def _add_fetch(view: ProcessView, c: CounterSum, worker: bool) -> None:
    view.fetch_s += c.s
    view.fetch_calls += c.calls
    if worker:
        view.fetch_in_workers += c.calls
    if c.cpu_timed:
        view.fetch_timed_s += c.s
        view.fetch_cpu_s += c.cpu
        view.fetch_thread_cpu_s += c.tcpu
        view.fetch_run_delay_s += c.rdelay
        view.fetch_cpu_calls += c.calls


def compute_breakdown(view: ProcessView, waits: list[tl.Interval] | None = None) -> None:
    """Disjoint slices of [start, end] that sum to the wall time.

    ``waits``: the data-wait intervals to use (a CUDA run passes the parts the GPU idled).
    """
    start, end = view.start, view.end
    first = view.first_step if view.first_step is not None else end
    first = min(max(first, start), end)
    loop_end = view.loop_end
    loop_end = min(max(loop_end, first), end) if loop_end is not None else first
    evals = eval_spans(view)
    assigned = tl.assign_by_priority(
        [
            ("eval", evals),
            # side files (a torch.save without tensors) are saving time too, though not checkpoints
            ("checkpoint", [*view.spans.get("checkpoint", []), *view.spans.get("save_side", [])]),
            ("data_wait", view.spans.get("data_wait", []) if waits is None else waits),
            # collectives the host waited for; a wait for data inside one (a straggler) is data wait
            ("communication", view.spans.get(COMMUNICATION, [])),
        ],
        first,
        end,
    )
    # An eval before the first step (nanoGPT evaluates at iteration 0) is evaluation, not
    # startup: the eval fix (fewer, smaller evals) removes it, a startup fix would not.
    early = tl.merge(tl.clip(evals, start, first))
    if early:
        assigned["eval"] = tl.merge([*early, *assigned["eval"]])
    slices: dict[str, list[tl.Interval]] = {
        "startup": tl.subtract([(start, first)], early) if first > start else [],
        "data_wait": assigned["data_wait"],
        "checkpoint": assigned["checkpoint"],
        "eval": assigned["eval"],
        "communication": assigned["communication"],
    }
    view.slices = slices
    view.slice_s = {key: tl.total(iv) for key, iv in slices.items()}
    # compute and other are what is left of [first, end] before / after the loop's end; the
    # assigned slices are disjoint and inside [first, end], so totals suffice (no interval pass).
    taken_s = sum(view.slice_s[k] for k in assigned) - tl.total(early)
    after_loop_s = sum(tl.total_after(iv, loop_end) for iv in assigned.values())
    view.slice_s["compute"] = max(0.0, (loop_end - first) - (taken_s - after_loop_s))
    view.slice_s["other"] = max(0.0, (end - loop_end) - after_loop_s)
    wall = view.wall_s
    view.breakdown = {key: view.slice_s[key] / wall for key in BREAKDOWN_KEYS}


def eval_spans(view: ProcessView) -> list[tl.Interval]:
    """Marked evals, plus the eval regions the hooks found in a hand-written loop
    (``eval_loop``, see :mod:`gpudoctor.hooks.eval_regions`) when the process trains:
    forward passes without backward in a process that never steps are inference, not eval."""
    found = view.spans.get("eval_loop", []) if view.step_times else []
    return [*view.spans.get("eval", []), *found]


def padding_summary(batches: list[BatchEvent]) -> dict[str, Any]:
    tokens = sum(int(b["tokens"]) for b in batches)
    pad = sum(int(b["pad"]) for b in batches)
    lengths = [int(x) for b in batches for x in b.get("lengths", [])]
    seq = [int(b["seq_len"]) for b in batches]
    return {
        "pad_fraction": (pad / tokens) if tokens else None,
        "max_length": max(seq) if seq else None,
        "p50_length": percentile(lengths, 50),
        "p99_length": percentile(lengths, 99),
        "batches_seen": len(batches),
    }


def dynamic_padding_tokens(batches: list[BatchEvent], multiple: int = 64) -> tuple[int, int]:
    """(tokens now, tokens if each batch were padded to its longest row, rounded up)."""
    now = sum(int(b["tokens"]) for b in batches)
    after = 0
    for b in batches:
        top = batchlengths.longest(b)  # exact, and the exact row count, even when lengths is a sample
        if top is None:
            after += int(b["tokens"])
            continue
        longest = batchlengths.padded_width(top, multiple)
        after += batchlengths.rows(b) * min(longest, int(b["seq_len"]))
    return now, after


def percentile(values: Sequence[N], pct: float) -> N | None:
    """Nearest-rank percentile (an observed value, never interpolated): the report's lengths
    and every fix value sized from them (:mod:`gpudoctor.rules.values`) use this one."""
    if not values:
        return None
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, int(round(pct / 100 * (len(ordered) - 1)))))
    return ordered[idx]


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0]}
    q = statistics.quantiles(values, n=10, method="inclusive")
    return {"p50": statistics.median(values), "p90": q[8]}
