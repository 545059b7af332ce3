"""One job's nodes side by side: per-rank summaries, clock alignment, the job as one training.

``gpudoctor run`` on each node of a multi-node job writes one run folder per node, each timed by
its own node's clock. Merging them must not trust those clocks: an NTP-less cluster drifts by
seconds. Ranks of one data-parallel job end each optimizer step together (the gradient
all-reduce holds every rank until the slowest arrives), so the step boundaries are events the
nodes share; a node's clock offset is the median difference between its lead rank's step ends
and the reference node's, step by step (the median, so a stray step does not move it).

Everything here keeps the merge streaming: a node's :class:`~gpudoctor.analysis.Analysis` is
reduced to a :class:`NodeSummary` (a few numbers per rank, step end times only for aligning)
and dropped, so 4096 ranks merge in the memory of a handful of run folders.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.analysis.model import Analysis, GpuStats, HostStats
from gpudoctor.analysis.process import ProcessView, quantiles
from gpudoctor.core.events import ProcEvent
from gpudoctor.core.schema import BREAKDOWN_KEYS
from gpudoctor.core.thresholds import RANK_GAP
from gpudoctor.recording.records import Records
from gpudoctor.recording.store import Recording

# Beyond this share of a step, step ends that should coincide do not: not one job, or not aligned.
MAX_RESIDUAL_STEP_SHARE = 0.5


@dataclass
class RankSummary:
    """What the merge keeps of one rank: its figures, not its events."""

    rank: int
    pid: int
    node: str
    local_rank: int | None
    start: float  # in its node's clock until :func:`apply_offset`
    end: float
    first_step: float | None
    breakdown: dict[str, float]
    seconds: dict[str, float]  # seconds per breakdown slice
    steps: int
    step_time_s: dict[str, float | None]
    data_waits: int

    def view(self) -> ProcessView:
        """A :class:`ProcessView` carrying only these figures, for the rules that compare ranks."""
        return ProcessView(pid=self.pid, rank=self.rank, records=Records(), start=self.start, end=self.end,
                           first_step=self.first_step, breakdown=dict(self.breakdown),
                           slice_s=dict(self.seconds), n_data_waits=self.data_waits,
                           proc=ProcEvent(k="proc", rank=self.rank, local_rank=self.local_rank), node=self.node)


@dataclass
class NodeSummary:
    """One node's run folder, reduced. ``offset_s``: what was added to its clock to align it."""

    label: str
    folder: Path
    meta: dict[str, Any]
    start: float
    end: float
    ranks: list[RankSummary]
    step_ends: list[float] | None  # the lead rank's step end times, until aligned (then dropped)
    notes: list[str] = field(default_factory=list)
    offset_s: float = 0.0
    residual_s: float | None = None  # p90 of |step end difference - offset| after alignment
    aligned_steps: int = 0
    gpus: int = 0
    gpu_names: list[str] = field(default_factory=list)

    @property
    def lowest_rank(self) -> int:
        return min((r.rank for r in self.ranks), default=1 << 30)


def summarize(a: Analysis, folder: Path, label: str) -> NodeSummary:
    """Reduce a node's analysis to its ranks' figures (every training process of the folder)."""
    ranks = []
    for p in a.procs:
        local = p.proc.get("local_rank")
        ranks.append(RankSummary(
            rank=p.rank, pid=p.pid, node=label, local_rank=local if isinstance(local, int) else None,
            start=p.start, end=p.end, first_step=p.first_step, breakdown=dict(p.breakdown),
            seconds={k: p.seconds(k) for k in BREAKDOWN_KEYS}, steps=len(p.step_times),
            step_time_s=quantiles(p.step_intervals_s()), data_waits=p.n_data_waits))
    lead = min(a.procs, key=lambda p: p.rank, default=None)
    return NodeSummary(label=label, folder=folder, meta=dict(a.rec.meta), start=a.start, end=a.end,
                       ranks=sorted(ranks, key=lambda r: r.rank), notes=list(a.notes),
                       step_ends=sorted(lead.step_times) if lead is not None else None,
                       gpus=a.gpu.count, gpu_names=list(a.gpu.names))


def clock_offset(reference: list[float], ends: list[float]) -> tuple[float, float, int] | None:
    """(offset to add to ``ends``' clock, residual p90 in s, steps matched), step n against step n.

    Every rank of a synchronous job runs the same steps from the first, so the n-th step end of
    one node's lead rank and the reference's are the same collective moment. None: no common step.
    """
    n = min(len(reference), len(ends))
    if n == 0:
        return None
    diffs = [r - e for r, e in zip(reference[:n], ends[:n], strict=False)]
    offset = statistics.median(diffs)
    spread = sorted(abs(d - offset) for d in diffs)
    return offset, spread[min(n - 1, int(0.9 * (n - 1) + 0.5))], n


def align(node: NodeSummary, reference: list[float] | None, step_s: float | None) -> None:
    """Set ``node.offset_s`` from the shared step ends, or say in a note why it stays unaligned."""
    found = clock_offset(reference or [], node.step_ends or [])
    node.step_ends = None  # the streaming merge keeps no step lists beyond the reference's
    if found is None:
        node.notes.append(f"{node.label}: no step boundaries to align its clock on; its times are as recorded")
        return
    offset, residual, matched = found
    if step_s and residual > MAX_RESIDUAL_STEP_SHARE * step_s:
        node.notes.append(
            f"{node.label}: its step ends do not line up with the reference node's (residual {residual:.3f} s "
            f"against {step_s:.3f} s steps): not aligned; are these folders one job's nodes?")
        return
    node.offset_s, node.residual_s, node.aligned_steps = offset, residual, matched
    for r in node.ranks:
        r.start += offset
        r.end += offset
        r.first_step = r.first_step + offset if r.first_step is not None else None


def slow_node(a: Analysis) -> tuple[str, float, float, float] | None:
    """(node, its fastest rank's data wait, the other nodes' median rank, gap as a share of the job)
    when every rank of one node waits for data at least :data:`~gpudoctor.core.thresholds.RANK_GAP` longer than the
    median rank elsewhere: the node's host is the straggler, not one rank's data path."""
    by_node: dict[str, list[ProcessView]] = {}
    for p in a.procs:
        node = p.node
        if isinstance(node, str) and node:
            by_node.setdefault(node, []).append(p)
    if len(by_node) < 2:
        return None
    found = None
    for node, views in by_node.items():
        if len(views) < 2:  # one rank: the rank is the straggler (straggler_rank says so)
            continue
        others = [p.breakdown["data_wait"] for n, vs in by_node.items() if n != node for p in vs]
        fastest = min(p.breakdown["data_wait"] for p in views)
        median = statistics.median(others)
        gap = (fastest - median) * views[0].wall_s / a.duration_s
        if gap >= RANK_GAP and (found is None or gap > found[3]):
            found = (node, fastest, median, gap)
    return found


def job_analysis(nodes: list[NodeSummary]) -> Analysis:
    """The job as one training of every node's ranks (aligned clocks), for the rules comparing ranks."""
    views = sorted((r.view() for n in nodes for r in n.ranks), key=lambda v: (v.rank, v.pid))
    start = min((v.start for v in views), default=min(n.start for n in nodes))
    end = max((v.end for v in views), default=max(n.end for n in nodes))
    rec = Recording(root=nodes[0].folder, meta={"start_time": start, "end_time": end})
    host = HostStats(cores=0, cpu_total_pct=None, cpu_run_cores=None, iowait_pct=None, read_mib_s=None,
                     disk_read_mib_s=None, rss_max_mib=None, samples=0)
    gpu = GpuStats(count=sum(n.gpus for n in nodes), names=[g for n in nodes for g in n.gpu_names],
                   busy_fraction=None, busy_in_loop=None, mem_used_max_mib=None, mem_total_mib=None, lost=[])
    return Analysis(rec=rec, start=start, end=end, procs=views, host=host, gpu=gpu,
                    trainings=[views] if views else [])
