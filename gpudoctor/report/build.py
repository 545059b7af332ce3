"""Recording -> analysis -> rules -> the report dict (SPEC's report.json).

Every command (run, attach, replay, report) ends here, so a report from a live
run and one re-rendered from disk are the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter, sub
from typing import Any

from gpudoctor._version import __version__
from gpudoctor.analysis import Analysis, analyze, gpu_timeline, memory
from gpudoctor.analysis.process import quantiles
from gpudoctor.analysis.saves import split_saves
from gpudoctor.common.numbers import iso_utc
from gpudoctor.core import schema
from gpudoctor.core.schema import SCHEMA, Report
from gpudoctor.recording.store import Recording
from gpudoctor.report.attach import attach_section, attach_time, summary_lines, timeline_caption
from gpudoctor.report.cost import Price, cost_section, resolve_price
from gpudoctor.report.verdict import Crash, Verdict, verdict
from gpudoctor.rules import Finding, Fix, run_rules

MAX_POINTS = 2000


@dataclass
class ReportOptions:
    price_per_gpu_hour: float | None = None
    gpus: int | None = None
    price_source: str | None = None  # where price_per_gpu_hour came from, when not --price-per-gpu-hour
    # Run on the analysis before the rules, by the mode that recorded it (``run``, ``try``): a
    # measurement only a live machine can take (launch/length_cost.py); returns a note or None.
    prepare: Callable[[Analysis], str | None] | None = None


@dataclass(frozen=True)
class Diagnosis:
    """A report with the analysis and findings it was built from: a mode that goes on from the
    report (``try`` plans its trial from them) asks these, never analyses the recording again."""

    report: Report
    analysis: Analysis
    findings: list[Finding]  # the rules' findings, settled, biggest first (no info findings)


def build_report(rec: Recording, options: ReportOptions | None = None) -> Report:
    return diagnose(rec, options).report


def diagnose(rec: Recording, options: ReportOptions | None = None) -> Diagnosis:
    """Analyse the recording once, run the rules once, and build the report from both."""
    options = options or ReportOptions()
    a = analyze(rec)
    if options.prepare is not None:
        note = options.prepare(a)
        if note:
            a.notes.append(note)
    # a replay's price from its config says so; else the option's name
    source = options.price_source if options.price_per_gpu_hour is not None else rec.meta.get("price_source")
    price = resolve_price(
        options.price_per_gpu_hour if options.price_per_gpu_hour is not None else rec.meta.get("price_per_gpu_hour"),
        options.gpus if options.gpus is not None else rec.meta.get("gpus_option"),
        a.gpu.names,
        source if isinstance(source, str) and source else "--price-per-gpu-hour",
    )
    findings, wasted = run_rules(a)
    infos = _info_findings(a, price)
    finding_dicts = [f.to_dict(price.usd_per_hour) for f in findings]
    report: Report = {
        "schema": SCHEMA,
        "run": _run_section(rec, a, price),
        "breakdown": breakdown_section(a.breakdown()),
        "shares": _shares(a.shares()),
        "padding": _padding(a.padding()),
        "startup": _startup(a.primary.startup_parts()) if a.primary is not None else None,
        "steps": _steps(a),
        # each save counted once, by kind (analysis/saves.py); null when no process was hooked
        "saves": split_saves(a.primary).to_dict() if a.primary is not None else None,
        "findings": finding_dicts + [f.to_dict(None) for f in infos],
        "cost": cost_section(price, wasted, a.duration_s, _projected_run_s(a)),
        "verdict": _verdict(a, findings, wasted, rec.meta),
        "per_rank": _per_rank(a),
        "timeline": _timeline(a),
        "profiler": _profiler_windows(a),
        "notes": list(a.notes),
        # the GPU's own clock (CUDA events) and MFU: null, with a reason for MFU, on a CPU run
        "gpu_timeline": gpu_timeline_section(a),
        "mfu": gpu_timeline.mfu(a).to_dict(),
    }
    nvml = (report["gpu_timeline"] or {}).get("nvml_verdict")
    if nvml:
        report["notes"].append(nvml)
    attached = attach_section(rec.meta, a.start)
    if attached is not None:  # what was loaded, from when, what is estimated: in every format
        report["attach"] = attached
        report["notes"] = [*summary_lines(attached), *report["notes"]]
    return Diagnosis(report, a, findings)


def gpu_timeline_section(a: Analysis) -> schema.GpuTimeline | None:
    """What the CUDA events measured, per step, with the host's own breakdown beside it."""
    fig = gpu_timeline.figures(a)
    if fig is None:
        return None
    n = fig.steps_timed
    windows = gpu_timeline.nvml_check(a)
    return {
        "source": "cuda_events",
        "steps_timed": n,
        "gpu_step_s": round(fig.gpu_step_s, 6),
        "busy_fraction": round(fig.busy_fraction, 4),
        "data_wait_gpu_idle_s": round(fig.wait_idle_s, 4),
        "data_wait_host_s": round(fig.host_wait_s, 4),
        "syncs_per_step": round(fig.syncs_per_step, 3),
        "sync_block_s_per_step": round(fig.sync_block_s / n, 6),
        "sync_idle_s_per_step": round(fig.sync_idle_s / n, 6),
        "h2d_s_per_step": round(fig.h2d_s_per_step, 6),
        "host_own_s_per_step": round(fig.host_own_s, 6) if fig.host_own_s is not None else None,
        "host_blocked_s_per_step": round(fig.host_blocked_s, 6) if fig.host_blocked_s is not None else None,
        "host_breakdown": breakdown_section(fig.host_breakdown),
        "nvml_windows": windows,
        "nvml_verdict": gpu_timeline.nvml_verdict(windows),
        "trusted": "cuda_events",
    }


def _profiler_windows(a: Analysis) -> list[schema.ProfilerWindow]:
    """torch.profiler windows: a cross-check of the hooks' data wait, and GPU kernel time."""
    out: list[schema.ProfilerWindow] = []
    for p in a.procs:
        for w in p.profiler:
            dt_s = float(w.get("dt") or 0.0)
            kernel = w.get("cuda_kernel_s")
            out.append({
                "rank": p.rank,
                "t_s": round(float(w["t0"]) - a.start, 3),
                "duration_s": round(dt_s, 4),
                "steps": w.get("steps"),
                "dataloader_s": round(float(w.get("dataloader_s") or 0.0), 4),
                "cuda_kernel_busy": round(kernel / dt_s, 4) if kernel is not None and dt_s > 0 else None,
            })
    return out


def _run_section(rec: Recording, a: Analysis, price: Price) -> schema.Run:
    meta = rec.meta
    started = meta.get("started_at") or iso_utc(a.start)
    run: schema.Run = {
        "mode": meta.get("mode", "run"),
        "command": meta.get("command", []),
        "pid": meta.get("pid"),
        "started_at": started,
        "duration_s": round(a.duration_s, 3),
        "host": meta.get("host", {}),
        "gpus": meta.get("gpus", []),
        "gpu_count": price.gpus,
        "price_per_gpu_hour_usd": price.per_gpu_hour_usd,
        "exit_code": meta.get("exit_code"),
        # "running" in meta.json means the doctor never finalized it (killed): the report is partial
        "status": "partial" if meta.get("status", "running") == "running" else meta["status"],
        "gpudoctor_version": __version__,
        # how the doctor kept out of the patient's way (SCHED_IDLE/nice 19, idle I/O); None: in-process API
        "doctor_priority": meta.get("doctor_priority"),
    }
    fault = doctor_fault(rec) if meta.get("status") == "crashed" else None
    if fault is not None:  # only then: a report without one reads as before
        run["doctor_fault"] = fault
    return run


def doctor_fault(rec: Recording) -> schema.DoctorFault | None:
    """The crash's ``uncaught`` event, when a frame of gpudoctor's was in its traceback."""
    for records in rec.events.values():
        for e in reversed(records.uncaught):
            if frames := e.get("doctor_frames"):
                return {"raised": bool(e.get("doctor_raised")), "frames": [str(f) for f in frames]}
    return None


def _steps(a: Analysis) -> schema.Steps:
    s = a.steps()
    first = s["first_step_at_s"]
    return {"count": s["count"], "first_step_at_s": round(first, 3) if first is not None else None,
            "step_time_s": step_times(s["step_time_s"])}


def _projected_run_s(a: Analysis) -> float | None:
    p = a.primary
    if p is None or p.plan is None:
        return None
    max_steps = p.plan.get("max_steps")
    p50 = a.steps()["step_time_s"]["p50"]
    done = len(p.step_times)
    if not isinstance(max_steps, int) or max_steps <= 0 or not p50:
        return None
    return float(a.duration_s + max(0, max_steps - done) * p50)


def _info_findings(a: Analysis, price: Price) -> list[Finding]:
    infos: list[Finding] = []

    def info(rule: str, title: str, evidence: str, summary: str) -> None:
        infos.append(Finding(rule, title, evidence, Fix(summary=summary), severity="info"))

    for problem in a.rec.meta.get("nvml_problems", []):
        info("gpu_unavailable", "GPU figures unavailable", problem,
             "GPU busy share, GPU memory and GPU-only rules are left out (null), not guessed.")
    if not a.has_inprocess:
        info("no_inprocess_data", "No in-process measurements",
             "No hooked Python training process reported a batch or a step, so the breakdown, data wait, "
             "padding and tokenization are unavailable.",
             "Run a Python training command (gpudoctor run -- python train.py), or check the stderr line "
             "'gpudoctor: in-process hooks not loaded'.")
    if price.usd_per_hour is None:
        info("cost_unavailable", "Dollar figures unavailable", price.source,
             "$/hour, wasted dollars and projected costs are left out (null), not guessed.")
    for note in a.notes:
        info("partial_recording", "Partial recording", note, "Figures cover the part that was recorded.")
    for note in a.rec.meta.get("attach_notes") or []:  # why hooks did not load, what is estimated
        if isinstance(note, str):
            info("attach_note", "Attach", note, "What the hooks could not measure is estimated from stack samples or left out.")
    return infos


def _verdict(a: Analysis, findings: list[Finding], wasted: float, meta: dict[str, Any]) -> str:
    """The report's first sentence (report/verdict.py). A crashed run is said to have crashed first:
    no figure of what ran before it is a clean bill of health."""
    crash = None
    if meta.get("status") == "crashed":
        steps = len(a.primary.step_times) if a.primary is not None else 0
        crash = Crash(meta.get("exit_code"), steps, doctor_fault(a.rec))
    return verdict(Verdict(findings, wasted, a.has_inprocess, share=a.share, crash=crash))


def _per_rank(a: Analysis) -> list[schema.RankEntry]:
    return [{"rank": p.rank, "pid": p.pid, "breakdown": breakdown_section(p.breakdown),
             "steps": {"count": len(p.step_times), "step_time_s": step_times(quantiles(p.step_intervals_s()))}}
            for p in a.procs]


def _timeline(a: Analysis) -> schema.Timeline:
    """Seconds since launch, or since the attach for ``attach`` (what came before is not drawn)."""
    attached = attach_time(a.rec.meta)
    t0 = attached if attached is not None else a.start
    host = a.rec.host
    stride = max(1, math.ceil(len(host) / MAX_POINTS))
    rows = host[::stride]
    gpu_rows = a.rec.gpu[:: max(1, math.ceil(len(a.rec.gpu) / MAX_POINTS))]
    series: schema.Series = {
        "t_s": [round(r["t"] - t0, 3) for r in rows],
        "cpu_pct": [r.get("cpu_proc_pct") for r in rows],
        "rss_mib": [r.get("rss_mib") for r in rows],
        "gpu_busy_pct": None,
        "gpu_t_s": None,
    }
    if gpu_rows and a.gpu.busy_fraction is not None:
        series["gpu_t_s"] = [round(r["t"] - t0, 3) for r in gpu_rows]
        series["gpu_busy_pct"] = [_mean_util(r) for r in gpu_rows]
        series["gpu_mem_mib"] = [None if v is None else round(v, 1) for v in memory.series_mib(gpu_rows, "gpu")]
    allocator = memory.allocator(a)
    if allocator:
        kept = allocator[:: max(1, math.ceil(len(allocator) / MAX_POINTS))]
        series["alloc_t_s"] = [round(x.t - t0, 3) for x in kept]
        series["alloc_allocated_mib"] = [round(x.allocated_mib, 1) for x in kept]
        series["alloc_reserved_mib"] = [round(x.reserved_mib, 1) for x in kept]
    spans: dict[str, list[list[float]]] = {k: [] for k in ("startup", "data_wait", "checkpoint", "eval", "format")}
    p = a.primary
    if p is not None:
        for key in ("startup", "data_wait", "checkpoint", "eval"):
            spans[key] = _rel(p.slices.get(key, []), t0)
        spans["format"] = _rel(p.spans.get("format", []), t0)
        if p.slices.get("communication"):  # DDP's all-reduce waits: a lane of their own, when there are any
            spans["communication"] = _rel(p.slices["communication"], t0)
    times = p.step_times if p else []
    steps = [round(t - t0, 3) for t in times[:: max(1, math.ceil(len(times) / MAX_POINTS))]]
    if attached is not None:
        spans = {k: [[max(0.0, x), y] for x, y in v if y > 0] for k, v in spans.items()}
    return {"duration_s": round(max(a.end - t0, 1e-9), 3), "series": series, "spans": spans,
            "steps_t_s": steps,
            "origin": "attach" if attached is not None else "launch", "caption": timeline_caption(a.rec.meta)}


def _mean_util(row: dict[str, Any]) -> float | None:
    vals = [g["util_pct"] for g in row.get("gpus", []) if g.get("util_pct") is not None and not g.get("lost")]
    return round(sum(vals) / len(vals), 1) if vals else None


def _rel(spans: list[tuple[float, float]], t0: float) -> list[list[float]]:
    """Spans as [start, end] seconds from t0; spans less than 10 ms apart are drawn as one bar
    (a 10k-batch run draws as a few bars), then at most MAX_POINTS bars."""
    spans = sorted(spans)
    if not spans:
        return []
    starts = list(map(itemgetter(0), spans))
    ends = list(map(itemgetter(1), spans))
    # A bar starts at each span that begins 10 ms or more after the previous one ends.
    cuts = [0, *(i for i, gap in enumerate(map(sub, starts[1:], ends), 1) if gap >= 0.01), len(spans)]
    bars = [(starts[i], ends[j - 1]) for i, j in zip(cuts, cuts[1:], strict=False)]
    if len(bars) > MAX_POINTS:
        bars = bars[:: math.ceil(len(bars) / MAX_POINTS)]
    return [[round(a_ - t0, 3), round(b - t0, 3)] for a_, b in bars]


# The analysis' figures as the schema's sections: each key named once here, so mypy holds every
# one to the schema's type; a float is rounded to 4 places, and one that is not finite is null.


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None and math.isfinite(x) else None


def breakdown_section(d: Mapping[str, float | None]) -> schema.Breakdown:
    """The analysis' slices (:data:`schema.BREAKDOWN_KEYS`); empty when it has none."""
    if not d:
        return {}
    out: schema.Breakdown = {"startup": _r(d["startup"]), "data_wait": _r(d["data_wait"]),
                             "compute": _r(d["compute"])}
    if "communication" in d:  # an older recording's analysis has none (it was inside compute)
        out["communication"] = _r(d["communication"])
    out.update({"checkpoint": _r(d["checkpoint"]), "eval": _r(d["eval"]), "other": _r(d["other"])})
    return out


def step_times(d: Mapping[str, float | None]) -> schema.StepTimes:
    """p50/p90 of the analysis' :func:`~gpudoctor.analysis.process.quantiles`."""
    return {"p50": _r(d["p50"]), "p90": _r(d["p90"])}


def _shares(d: Mapping[str, float | None]) -> schema.Shares:
    return {"tokenization": _r(d["tokenization"]), "gpu_busy": _r(d["gpu_busy"]), "cpu_busy": _r(d["cpu_busy"])}


def _padding(d: Mapping[str, Any]) -> schema.Padding:
    """:func:`~gpudoctor.analysis.process.padding_summary`: a fraction, then lengths and a count (ints)."""
    return {"pad_fraction": _r(d["pad_fraction"]), "max_length": d["max_length"], "p50_length": d["p50_length"],
            "p99_length": d["p99_length"], "batches_seen": d["batches_seen"]}


def _startup(d: Mapping[str, float]) -> schema.StartupParts:
    """:meth:`~gpudoctor.analysis.process.ProcessView.startup_parts`, in seconds."""
    return {"total_s": _round_s(d["total_s"]), "imports_s": _round_s(d["imports_s"]),
            "model_load_s": _round_s(d["model_load_s"]), "data_load_s": _round_s(d["data_load_s"]),
            "format_s": _round_s(d["format_s"]), "other_s": _round_s(d["other_s"])}


def _round_s(x: float) -> float:
    return round(x, 4)  # startup seconds are sums of finite spans

