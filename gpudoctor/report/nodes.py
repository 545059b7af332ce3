"""One report for a multi-node job, from the run folder ``gpudoctor run`` wrote on each node.

Streaming, so a 4096-rank job merges on one machine: each folder is loaded, analysed, its rules
run and reduced to per-rank summaries (:func:`gpudoctor.analysis.nodes.summarize`) before the
next is opened; what is kept per node is a few numbers per rank and one finding per rule. The
nodes' clocks are aligned on the job's step ends (:func:`gpudoctor.analysis.nodes.align`) and the
report says by how much (``nodes`` section). The job-wide rules (``straggler_rank`` across every
node's ranks, ``straggler_node``) then run on the job as one training.

A node's own findings (a data stall on one host) are the job's too: in synchronous data-parallel
training every node waits for the slowest at each step. Each rule that fired on several nodes
is one finding, from the node where it cost most, naming the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor._version import __version__
from gpudoctor.analysis import analyze
from gpudoctor.analysis.nodes import NodeSummary, align, job_analysis, summarize
from gpudoctor.common.errors import UserError
from gpudoctor.common.numbers import iso_utc
from gpudoctor.common.wording import plural
from gpudoctor.core.schema import (
    SCHEMA,
    NodeEntry,
    Nodes,
    RankEntry,
    Report,
    Run,
)
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import ReportOptions, breakdown_section, step_times
from gpudoctor.report.cost import cost_section, resolve_price
from gpudoctor.report.verdict import Verdict, verdict
from gpudoctor.rules import Finding, Fix, run_rules
from gpudoctor.rules.base import settle_findings
from gpudoctor.rules.nodes import StragglerNode
from gpudoctor.rules.ranks import StragglerRank

JOB_RULES = (StragglerRank, StragglerNode)  # they compare ranks: run on the whole job, not per node
MAX_NAMED_NODES = 16
METHOD = ("each node's lead rank's optimizer-step ends matched step by step with the reference node's "
          "(the gradient all-reduce ends every rank's step together); offset = median difference")


@dataclass
class _Seen:
    """A rule that fired on some nodes: the finding where it cost most, and where else it fired."""

    finding: Finding
    node: str
    waste: float
    nodes: list[str] = field(default_factory=list)


def labels(folders: list[Path]) -> list[str]:
    """Each folder's name (``node0/``), or its path where two names are the same."""
    names = [f.resolve().name or str(f) for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders, strict=True)]


def merge_report(folders: list[Path], options: ReportOptions | None = None) -> Report:
    options = options or ReportOptions()
    nodes: list[NodeSummary] = []
    seen: dict[str, _Seen] = {}
    node_rules: dict[str, list[str]] = {}
    reference: list[float] | None = None
    step_s: float | None = None
    for folder, label in zip(folders, labels(folders), strict=True):
        a = analyze(load_recording(folder))
        found, _ = run_rules(a)
        node = summarize(a, folder, label)
        del a  # streaming: the events go, the summary stays
        node_rules[label] = [f.rule for f in found]
        _keep(seen, found, node)
        if reference is None and node.step_ends:
            reference, node.step_ends = node.step_ends, None
            step_s = node.ranks[0].step_time_s.get("p50") if node.ranks else None
            node.aligned_steps, node.residual_s = len(reference), 0.0
        else:
            align(node, reference, step_s)
        nodes.append(node)
    _check_one_job(nodes)
    _rebase(nodes)
    return _report(nodes, seen, node_rules, options)


def _keep(seen: dict[str, _Seen], found: list[Finding], node: NodeSummary) -> None:
    for f in found:
        if f.rule in {r.name for r in JOB_RULES}:
            continue  # decided across every node's ranks below
        s = seen.get(f.rule)
        if s is None or f.waste_fraction > s.waste:
            seen[f.rule] = _Seen(f, node.label, f.waste_fraction, s.nodes if s else [])
        seen[f.rule].nodes.append(node.label)


def _check_one_job(nodes: list[NodeSummary]) -> None:
    where: dict[int, str] = {}
    for n in nodes:
        for r in n.ranks:
            if r.rank in where:
                raise UserError(f"rank {r.rank} is in both {where[r.rank]} and {n.label}: these folders are not "
                                "the nodes of one job (or one was passed twice); pass each node's run folder once")
            where[r.rank] = n.label


def _rebase(nodes: list[NodeSummary]) -> None:
    """Offsets relative to the node holding the lowest rank (rank 0's clock is the job's)."""
    aligned = [n for n in nodes if n.residual_s is not None and n.ranks]
    if not aligned:
        return
    base = min(aligned, key=lambda n: n.lowest_rank).offset_s
    for n in aligned:
        n.offset_s -= base
        for r in n.ranks:
            r.start -= base
            r.end -= base
            r.first_step = r.first_step - base if r.first_step is not None else None


def _report(nodes: list[NodeSummary], seen: dict[str, _Seen], node_rules: dict[str, list[str]],
            options: ReportOptions) -> Report:
    job = job_analysis(nodes)
    first = nodes[0].meta
    price = resolve_price(options.price_per_gpu_hour if options.price_per_gpu_hour is not None
                          else first.get("price_per_gpu_hour"), options.gpus, job.gpu.names)
    findings = [f for rule in JOB_RULES if (f := rule().match(job)) is not None]
    findings += [_named(s) for s in seen.values()]
    wasted = settle_findings(job.breakdown(), findings)
    findings.sort(key=lambda f: -f.waste_fraction)
    infos = [] if price.usd_per_hour is not None else [Finding(
        "cost_unavailable", "Dollar figures unavailable", price.source,
        Fix(summary="Pass --price-per-gpu-hour USD (and --gpus N, the whole job's GPUs) to price the waste."),
        severity="info")]
    lead = min((r for n in nodes for r in n.ranks), key=lambda r: r.rank, default=None)
    notes = [note if note.startswith(n.label) else f"{n.label}: {note}" for n in nodes for note in n.notes]
    return {
        "schema": SCHEMA,
        "run": _run(nodes, job.start, job.duration_s, price),
        "breakdown": breakdown_section(job.breakdown()),
        "steps": {
            "count": lead.steps if lead else 0,
            "first_step_at_s": round(lead.first_step - job.start, 3) if lead and lead.first_step else None,
            "step_time_s": step_times(lead.step_time_s) if lead else {"p50": None, "p90": None},
        },
        "findings": [f.to_dict(price.usd_per_hour) for f in findings] + [f.to_dict(None) for f in infos],
        "cost": cost_section(price, wasted, job.duration_s, None),
        "verdict": _verdict(nodes, findings, wasted),
        "per_rank": [_rank_entry(r) for n in nodes for r in n.ranks],
        "nodes": _nodes_section(nodes, node_rules),
        "notes": notes,
    }


def _named(s: _Seen) -> Finding:
    """A node's finding as the job's: its node named, and the other nodes where the rule fired."""
    f = s.finding
    others = [n for n in s.nodes if n != s.node]
    more = ""
    if others:
        shown = ", ".join(others[:MAX_NAMED_NODES])
        more = f" (also on {shown}{f' and {len(others) - MAX_NAMED_NODES} more' if len(others) > MAX_NAMED_NODES else ''})"
    f.title = f"{s.node}: {f.title}"
    f.evidence = f"On {s.node}{more}: {f.evidence}"
    f.data = {**f.data, "node": s.node, "nodes": s.nodes[:MAX_NAMED_NODES], "node_count": len(s.nodes)}
    return f


def _run(nodes: list[NodeSummary], start: float, duration_s: float, price: Any) -> Run:
    first = nodes[0].meta
    statuses = [str(n.meta.get("status") or "running") for n in nodes]
    status = next((s for s in ("crashed", "interrupted", "running") if s in statuses), "finished")
    codes = [n.meta.get("exit_code") for n in nodes]
    hosts = sorted({str((n.meta.get("host") or {}).get("hostname") or "?") for n in nodes})
    return {
        "mode": "merge",
        "command": first.get("command", []),
        "pid": None,
        "started_at": iso_utc(start),
        "duration_s": round(duration_s, 3),
        "host": {"hostname": ", ".join(hosts[:MAX_NAMED_NODES]) + (" ..." if len(hosts) > MAX_NAMED_NODES else ""),
                 "nodes": len(nodes), "ranks": sum(len(n.ranks) for n in nodes)},
        "gpus": [g for n in nodes for g in (n.meta.get("gpus") or [])][:4096],
        "gpu_count": price.gpus,
        "price_per_gpu_hour_usd": price.per_gpu_hour_usd,
        "exit_code": next((c for c in codes if c not in (0, None)), codes[0] if codes else None),
        "status": "partial" if status == "running" else status,
        "gpudoctor_version": __version__,
    }


def _rank_entry(r: Any) -> RankEntry:
    return {"rank": r.rank, "pid": r.pid, "node": r.node, "local_rank": r.local_rank,
            "breakdown": breakdown_section(r.breakdown), "data_wait_s": round(r.seconds["data_wait"], 3),
            "communication_s": round(float(r.seconds.get("communication", 0.0)), 3),
            "checkpoint_s": round(float(r.seconds["checkpoint"]), 3), "wall_s": round(r.end - r.start, 3),
            "steps": {"count": r.steps, "step_time_s": step_times(r.step_time_s)}}


def _nodes_section(nodes: list[NodeSummary], node_rules: dict[str, list[str]]) -> Nodes:
    aligned = [n for n in nodes if n.residual_s is not None]
    ref = next((n for n in aligned if n.offset_s == 0.0), None)
    return {
        "reference": ref.label if ref else None,
        "method": METHOD,
        "skew_corrected_s": round(max((abs(n.offset_s) for n in aligned), default=0.0), 4),
        "nodes": [_node_entry(n, node_rules.get(n.label, [])) for n in nodes],
    }


def _node_entry(n: NodeSummary, rules: list[str]) -> NodeEntry:
    waits = [r.seconds["data_wait"] for r in n.ranks]
    keys = n.ranks[0].breakdown if n.ranks else {}
    lead = n.ranks[0] if n.ranks else None
    return {
        "node": n.label,
        "folder": str(n.folder),
        "host": (n.meta.get("host") or {}).get("hostname"),
        "ranks": [r.rank for r in n.ranks],
        "status": str(n.meta.get("status") or "partial"),
        "duration_s": round(max(n.end - n.start, 0.0), 3),
        "clock_offset_s": round(n.offset_s, 4) if n.residual_s is not None else None,
        "alignment_residual_s": round(n.residual_s, 4) if n.residual_s is not None else None,
        "aligned_steps": n.aligned_steps,
        "breakdown": breakdown_section({k: sum(r.breakdown[k] for r in n.ranks) / len(n.ranks) for k in keys}),
        "data_wait_s": round(sum(waits) / len(waits), 3) if waits else None,
        "data_wait_s_max": round(max(waits), 3) if waits else None,
        "checkpoint_s": round(float(max((r.seconds["checkpoint"] for r in n.ranks), default=0.0)), 3),
        "step_time_s": step_times(lead.step_time_s) if lead else {"p50": None, "p90": None},
        "findings": sorted(set(rules)),
    }


def _verdict(nodes: list[NodeSummary], findings: list[Finding], wasted: float) -> str:
    ranks = sum(len(n.ranks) for n in nodes)
    where = f"{plural(len(nodes), 'node')}, {plural(ranks, 'rank')}"
    return verdict(Verdict(findings, wasted, measured=ranks > 0, job=where))
