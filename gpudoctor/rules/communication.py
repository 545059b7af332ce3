"""Rules for the communication data parallelism adds: all-reduces per micro-step, the unused
parameter search, all-reduce not hidden behind backward, and FSDP's parameters gathered twice a step.

Each rank's collectives come from :mod:`gpudoctor.analysis.comm`. Of a job's ranks the one whose
all-reduce was exposed the least is read: a rank that waits for a slower one inside the
all-reduce shows that wait as communication, but it is the slow rank's doing (``straggler_rank``),
not the wire's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.comm import CommFigures, comm_figures, exposed_total_s, step_s
from gpudoctor.analysis.process import ProcessView
from gpudoctor.core.thresholds import EXPOSED_ALLREDUCE_OF_STEP, REGATHER_OF_STEP, percent
from gpudoctor.rules import vocabulary
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.names import names_for

MIN_SEARCH_SHARE = 0.005  # of a step: a search below it is noise beside the step's own spread
MEMORY_FILL = 0.90  # of a GPU's memory: kept parameters that would take peak use past it do not fit


@dataclass(frozen=True)
class Rank:
    """One rank's collectives beside its own step time."""

    p: ProcessView
    fig: CommFigures
    step_s: float | None

    @property
    def steps(self) -> int:
        return len(self.p.step_times)


def _ranks(a: Analysis) -> list[Rank]:
    """Ranks of the first training that measured DDP's all-reduce, least exposed first."""
    for group in a.trainings or [a.procs]:
        ranks = [Rank(p, f, step_s(p)) for p in group if (f := comm_figures(p)) is not None and f.ddp]
        if ranks:
            return sorted(ranks, key=lambda r: (r.fig.per_allreduce_s is None, r.fig.per_allreduce_s or 0.0))
    return []


def loop_speedup(step: float | None, saved_s: float) -> float | None:
    """The loop's speedup when each step takes ``saved_s`` less."""
    if not step or saved_s <= 0 or saved_s >= step:
        return None
    return step / (step - saved_s)


# -- sync_every_microstep ---------------------------------------------------------------------
@dataclass(frozen=True)
class SyncFigures:
    rank: int
    micro: int  # micro-steps per optimizer step
    synced: int  # all-reduces per optimizer step
    per_allreduce_s: float  # exposed seconds of one
    busy_per_allreduce_s: float  # in-flight seconds of one
    mb: float  # MB per all-reduce
    step_s: float | None
    saved_s: float  # per optimizer step, with one all-reduce instead of ``synced`` (the middle of the range)
    saved_low_s: float  # ... their exposed seconds only (overlap cost backward nothing)
    saved_up_to_s: float  # ... their in-flight seconds (backward stalled all the while they overlapped it)
    speedup: float | None
    speedup_low: float | None
    speedup_up_to: float | None


class SyncEveryMicrostep(Rule):
    name = "sync_every_microstep"
    fires_when = ("DDP all-reduces its gradients on every micro-step of gradient accumulation "
                  "(≥ 2 all-reduces per optimizer step: no `no_sync()`)")
    fix_from = ("`with model.no_sync():` on all but the last micro-step (Accelerate: `accelerator.accumulate(model)`); "
                "the gain is (all-reduces per step − 1) × one all-reduce's measured cost: from its exposed "
                "seconds to its in-flight seconds, the middle predicted")

    def match(self, a: Analysis) -> Finding | None:
        ranks = _ranks(a)
        fig = _sync_figures(ranks[0]) if ranks else None
        if fig is None:
            return None
        fix = vocabulary.no_sync_fix(names_for(ranks[0].p), fig.micro)
        return _word_sync(fig, fix, _sync_claims(ranks[0], fig))


def _sync_figures(r: Rank) -> SyncFigures | None:
    f = r.fig
    per = f.per_allreduce_s
    if f.micro < 2 or f.synced < 2 or per is None:
        return None
    synced = round(f.synced)
    busy = max(per, f.busy_per_allreduce_s or per)
    low, up_to = (synced - 1) * per, (synced - 1) * busy
    saved = (low + up_to) / 2  # an all-reduce overlapping backward shares the cores with it (gloo)
    return SyncFigures(r.p.rank, round(f.micro), synced, per, busy, f.bytes / synced / 1e6, r.step_s, saved,
                       low, up_to, loop_speedup(r.step_s, saved), loop_speedup(r.step_s, low),
                       loop_speedup(r.step_s, up_to))


def _sync_claims(r: Rank, fig: SyncFigures) -> list[Claim]:
    """The exposed all-reduces dropped (communication), and half their overlapped seconds, up to all
    of them: an all-reduce in flight during backward shares the cores (gloo) or the memory bandwidth
    with it, and how much that slowed backward (compute) is not measured."""
    p = r.p
    allreduce_s = exposed_total_s(p)  # the host's waits (gloo), else the GPU clock's (NCCL)
    overlapped_s = max(0.0, sum(float(e.get("comm_s") or 0.0) for e in p.comm) - allreduce_s)
    dropped = 1 - 1 / fig.synced
    claims = [claim("communication", dropped * allreduce_s, p.seconds("communication"), part="ddp_allreduce",
                    part_s=min(allreduce_s, p.seconds("communication")) or None)]
    if overlapped_s > 0 and p.seconds("compute") > 0:
        claims.append(claim("compute", dropped * overlapped_s / 2, p.seconds("compute"), part="ddp_overlap",
                            part_s=min(overlapped_s, p.seconds("compute")), up_to_s=dropped * overlapped_s))
    return claims


def _word_sync(fig: SyncFigures, fix: vocabulary.CallFix, claims: list[Claim]) -> Finding:
    ms = 1000 * fig.per_allreduce_s
    evidence = (f"Rank {fig.rank} all-reduced its gradients {fig.synced} times per optimizer step "
                f"({fig.micro} micro-steps of accumulation, none under no_sync()): {fig.mb:.1f} MB and "
                f"{ms:.1f} ms of waiting each, where one all-reduce per step is enough.")
    gain = f" about {fig.speedup:.2f}x faster" if fig.speedup else " faster"
    if fig.speedup and fig.speedup_low and fig.speedup_up_to and fig.speedup_up_to > fig.speedup_low + 5e-3:
        gain += (f": {fig.speedup_low:.2f}x from the waits alone, {fig.speedup_up_to:.2f}x if backward stalled "
                 "while they overlapped it")
    summary = (f"All-reduce once per optimizer step: skip the gradient sync on the first {fig.micro - 1} "
               f"micro-steps ({1000 * fig.saved_s:.0f} ms a step less; the loop{gain}).")
    return Finding(
        rule=SyncEveryMicrostep.name, title="Gradients are all-reduced on every micro-step",
        claims=claims, evidence=evidence,
        fix=Fix(summary=summary, config=fix.config, snippet=fix.snippet, library=fix.library, call=fix.call),
        data={"rank": fig.rank, "micro_steps": fig.micro, "allreduces_per_step": fig.synced,
              "per_allreduce_s": round(fig.per_allreduce_s, 4), "busy_per_allreduce_s": round(fig.busy_per_allreduce_s, 4),
              "mb_per_allreduce": round(fig.mb, 2), "step_s": _r(fig.step_s), "saved_per_step_s": round(fig.saved_s, 4),
              "saved_per_step_s_range": [round(fig.saved_low_s, 4), round(fig.saved_up_to_s, 4)],
              "predicted_loop_speedup": _r(fig.speedup),
              "predicted_loop_speedup_range": [_r(fig.speedup_low), _r(fig.speedup_up_to)]},
    )


# -- unused_parameter_search ----------------------------------------------------------------
@dataclass(frozen=True)
class SearchFigures:
    rank: int
    search_s: float  # per step
    share: float  # of a step
    params: int
    step_s: float | None
    speedup: float | None


class UnusedParameterSearch(Rule):
    name = "unused_parameter_search"
    fires_when = ("DDP built with `find_unused_parameters=True` while every parameter got a gradient, "
                  "its graph search ≥ 0.5% of a step")
    fix_from = ("`find_unused_parameters=False` (or `static_graph=True`) in the call the run used; "
                "the gain is the measured seconds of the search per step")

    def match(self, a: Analysis) -> Finding | None:
        found = _search_figures(_ranks(a))
        if found is None:
            return None
        fig, p = found
        fix = vocabulary.find_unused_fix(names_for(p))
        removed = fig.search_s * max(1, len(p.step_times))
        return _word_search(fig, fix, [claim("compute", removed, p.seconds("compute"))])


def _search_figures(ranks: list[Rank]) -> tuple[SearchFigures, ProcessView] | None:
    if not ranks:
        return None
    r = max(ranks, key=lambda x: x.fig.search_s)  # the rank the search costs most sets the pace
    ddp: Mapping[str, Any] = r.fig.ddp or {}
    if not ddp.get("find_unused_parameters") or ddp.get("static_graph") or r.fig.unused_params != 0:
        return None
    share = r.fig.search_s / r.step_s if r.step_s else 0.0
    if share < MIN_SEARCH_SHARE:
        return None
    return SearchFigures(r.p.rank, r.fig.search_s, share, int(ddp.get("params") or 0), r.step_s,
                         loop_speedup(r.step_s, r.fig.search_s)), r.p


def _word_search(fig: SearchFigures, fix: vocabulary.CallFix, claims: list[Claim]) -> Finding:
    evidence = (f"DistributedDataParallel was built with find_unused_parameters=True, yet all {fig.params} "
                f"parameters got a gradient at the first step; the search for unused ones walked the "
                f"autograd graph after every forward: {1000 * fig.search_s:.1f} ms a step on rank {fig.rank}, "
                f"{pct(fig.share)} of a step.")
    summary = ("Build DistributedDataParallel with find_unused_parameters=False (or static_graph=True "
               "if some parameter is unused the same way every step)"
               + (f": the loop about {fig.speedup:.2f}x faster." if fig.speedup else "."))
    return Finding(
        rule=UnusedParameterSearch.name, title="DDP searches for unused parameters that do not exist",
        claims=claims, evidence=evidence,
        fix=Fix(summary=summary, config=fix.config, snippet=fix.snippet, library=fix.library, call=fix.call),
        data={"rank": fig.rank, "search_per_step_s": round(fig.search_s, 4), "params": fig.params,
              "step_s": _r(fig.step_s), "predicted_loop_speedup": _r(fig.speedup)},
    )


# -- exposed_communication ------------------------------------------------------------------
@dataclass(frozen=True)
class ExposedFigures:
    rank: int
    exposed_s: float  # per step
    busy_s: float  # per step, in flight
    share: float  # of a step, the least exposed rank
    mb: float  # per step
    bucket_cap_mb: float | None
    as_view: bool
    on_gpu: bool
    step_s: float | None
    gpu_clock: bool = False  # measured on the GPU's clock (the training stream's wait), not the host's


class ExposedCommunication(Rule):
    name = "exposed_communication"
    fires_when = (f"DDP's gradient all-reduce not hidden behind backward ≥ {percent(EXPOSED_ALLREDUCE_OF_STEP)} of a "
                  "step on the least exposed rank "
                  "(one all-reduce per step)")
    fix_from = ("on a GPU: smaller buckets (`bucket_cap_mb` halved), `gradient_as_bucket_view=True`, "
                "`bf16_compress_hook` halving the bytes: at least half of the exposed seconds, up to all of them (the "
                "overlap after the change is not measured); on CPU (gloo) an `info` note claiming nothing: the "
                "all-reduce runs on backward's own cores, and compression or bucket sizes were measured to give "
                "nothing there (bench figures in docs/ddp.md)")

    def match(self, a: Analysis) -> Finding | None:
        ranks = _ranks(a)
        fig = _exposed_figures(ranks[0]) if ranks else None
        if fig is None:
            return None
        p = ranks[0].p
        allreduce_s = min(p.seconds("communication"), exposed_total_s(p))
        fix = vocabulary.overlap_fix(names_for(p), fig.bucket_cap_mb, fig.on_gpu)
        if not fig.on_gpu:
            return _word_exposed_on_cpu(fig)
        claims = [claim("communication", 0.5 * allreduce_s, p.seconds("communication"), part="ddp_allreduce",
                        part_s=allreduce_s, up_to_s=allreduce_s)]
        return _word_exposed(fig, fix, claims)


def _exposed_figures(r: Rank) -> ExposedFigures | None:
    f = r.fig
    if f.exposed_s is None or f.synced < 1 or (f.micro >= 2 and f.synced >= 2):
        return None  # not on the host clock; or sync_every_microstep's to fix first
    share = f.exposed_s / r.step_s if r.step_s else 0.0
    if share < EXPOSED_ALLREDUCE_OF_STEP:
        return None
    ddp: Mapping[str, Any] = f.ddp or {}
    cap = ddp.get("bucket_cap_mb")
    return ExposedFigures(r.p.rank, f.exposed_s, f.comm_s, share, f.bytes / 1e6,
                          float(cap) if isinstance(cap, (int, float)) else None,
                          bool(ddp.get("gradient_as_bucket_view")), ddp.get("device") == "cuda", r.step_s,
                          f.exposed_clock == "gpu")


def _evidence_exposed(fig: ExposedFigures) -> str:
    who = f"rank {fig.rank}'s training stream" if fig.gpu_clock else f"rank {fig.rank}"
    clock = " (CUDA events on the GPU's clock)" if fig.gpu_clock else ""
    return (f"After backward, {who} waited {1000 * fig.exposed_s:.1f} ms a step{clock} for the gradient "
                f"all-reduce ({fig.mb:.1f} MB; {1000 * fig.busy_s:.1f} ms in flight in all), "
                f"{pct(fig.share)} of a step: the all-reduce is not hidden behind backward"
                + (f" (buckets of {fig.bucket_cap_mb:g} MB" if fig.bucket_cap_mb else " (")
                + (", gradients copied into them)" if not fig.as_view else ")") + ".")


def _word_exposed_on_cpu(fig: ExposedFigures) -> Finding:
    """On CPU (gloo) the all-reduce is computed on the cores backward uses: overlapping it or sending
    fp16 trades one for the other (measured: no gain), so the wait is said, and nothing is promised."""
    summary = ("No fix with a predicted gain on CPU: gloo sums the gradients on the cores backward uses, so "
               "smaller buckets or a compression hook move the time rather than remove it. It shrinks with "
               "fewer, larger steps (a larger batch per rank) or goes to the GPUs' interconnect under NCCL.")
    return Finding(
        rule=ExposedCommunication.name, severity="info", title="The gradient all-reduce is not hidden behind backward",
        claims=[], evidence=_evidence_exposed(fig), fix=Fix(summary=summary),
        data=_exposed_data(fig))


def _exposed_data(fig: ExposedFigures) -> dict[str, Any]:
    return {"rank": fig.rank, "exposed_per_step_s": round(fig.exposed_s, 4), "busy_per_step_s": round(fig.busy_s, 4),
            "mb_per_step": round(fig.mb, 2), "bucket_cap_mb": fig.bucket_cap_mb, "step_s": _r(fig.step_s),
            "share_of_step": round(fig.share, 4)}


def _word_exposed(fig: ExposedFigures, fix: vocabulary.CallFix, claims: list[Claim]) -> Finding:
    evidence = _evidence_exposed(fig)
    summary = ("Overlap the all-reduce with backward and send fewer bytes: " + fix.snippet.splitlines()[0].strip()
               + ", then a compression hook (" + ("bf16" if fig.on_gpu else "fp16") + "_compress_hook). "
               "At least half of the wait goes; how much of the rest hides behind backward is not measured.")
    return Finding(
        rule=ExposedCommunication.name, title="The gradient all-reduce is not hidden behind backward",
        claims=claims, evidence=evidence,
        fix=Fix(summary=summary, config=fix.config, snippet=fix.snippet, library=fix.library, call=fix.call),
        data={**_exposed_data(fig),
              "predicted_loop_speedup": _r(loop_speedup(fig.step_s, 0.5 * fig.exposed_s)),
              "predicted_loop_speedup_up_to": _r(loop_speedup(fig.step_s, fig.exposed_s))},
    )


# -- fsdp_backward_allgather ----------------------------------------------------------------
@dataclass(frozen=True)
class RegatherFigures:
    rank: int
    fsdp: int  # 1 or 2
    gathers: int  # all-gathers in backward per step
    gather_s: float  # the wait for them per step, host or GPU clock (the least on any rank: the wire, not a straggler)
    gathered_mib: float  # bytes they gathered per step
    extra_mib: float | None  # memory a rank holds more once forward keeps them (None: world size unknown)
    share: float  # of a step
    step_s: float | None
    speedup: float | None
    gpu_clock: bool  # the training stream's waits (CUDA events), not the host's
    used_mib: float | None = None  # peak GPU memory in use (NVML), where a GPU was sampled
    total_mib: float | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the kept parameters fit beside the measured peak (None: no GPU memory figure)."""
        if self.extra_mib is None or not self.used_mib or not self.total_mib:
            return None
        return self.used_mib + self.extra_mib <= MEMORY_FILL * self.total_mib


class FsdpBackwardAllgather(Rule):
    name = "fsdp_backward_allgather"
    fires_when = ("FSDP all-gathers the parameters again in backward (`reshard_after_forward=True`, FULL_SHARD), "
                  f"the wait for those all-gathers ≥ {percent(REGATHER_OF_STEP)} of a step on the rank that waited least "
                  "(host clock on gloo, the "
                  "training stream's on the GPU clock under NCCL)")
    fix_from = ("`reshard_after_forward=False` (FSDP2 `fully_shard`, Accelerate's plugin, the Trainer's `fsdp_config`) "
                "or `SHARD_GRAD_OP` (FSDP1, Lightning): the measured seconds of the backward all-gathers per step, "
                "for the unsharded parameters held from forward to backward (the memory it costs is said, and set "
                "beside the GPU's measured peak: where it would not fit, an `info` note claiming nothing)")

    def match(self, a: Analysis) -> Finding | None:
        found = _regather_figures(a)
        if found is None:
            return None
        fig, p = found
        fix = vocabulary.reshard_fix(names_for(p), fig.fsdp)
        if fig.fits is False:
            return _word_regather(fig, fix, [])
        removed = fig.gather_s * max(1, len(p.step_times))
        claims = [claim("communication", removed, p.seconds("communication"), part="fsdp_allgather",
                        part_s=min(removed, p.seconds("communication")) or None)]
        return _word_regather(fig, fix, claims)


def _regather_figures(a: Analysis) -> tuple[RegatherFigures, ProcessView] | None:
    for group in a.trainings or [a.procs]:
        ranks = [Rank(p, f, step_s(p)) for p in group
                 if (f := comm_figures(p)) is not None and f.fsdp and f.gather_bwd >= 1]
        if ranks:
            break
    else:
        return None
    r = min(ranks, key=lambda x: x.fig.gather_bwd_s)  # a straggler's partners wait inside the gathers
    f = r.fig
    share = f.gather_bwd_s / r.step_s if r.step_s else 0.0
    if share < REGATHER_OF_STEP:
        return None
    world = r.p.proc.get("world_size")
    mib = f.gather_bwd_bytes / 2**20
    extra = mib * (int(world) - 1) / int(world) if isinstance(world, int) and world > 0 else None
    return RegatherFigures(r.p.rank, int(f.fsdp or 2), round(f.gather_bwd), f.gather_bwd_s, mib, extra, share,
                           r.step_s, loop_speedup(r.step_s, f.gather_bwd_s), f.gather_clock == "gpu",
                           a.gpu.mem_used_max_mib, a.gpu.mem_total_mib), r.p


def _word_regather(fig: RegatherFigures, fix: vocabulary.CallFix, claims: list[Claim]) -> Finding:
    evidence = (f"FSDP{'2' if fig.fsdp == 2 else ''} freed each unit's gathered parameters after its forward and "
                f"all-gathered them again in backward: {fig.gathers} all-gathers of {fig.gathered_mib:.1f} MiB a step; "
                + (f"rank {fig.rank}'s training stream waited {1000 * fig.gather_s:.1f} ms a step for them "
                   "(CUDA events on the GPU's clock)" if fig.gpu_clock else
                   f"rank {fig.rank} waited {1000 * fig.gather_s:.1f} ms a step in them")
                + f", {pct(fig.share)} of a step.")
    lines = fix.snippet.splitlines()
    line = next((x for x in lines if "reshard_after_forward" in x or "SHARD_GRAD_OP" in x), lines[-1])
    call = line.split("#")[0].strip()
    keep = f"Keep the gathered parameters from forward to backward ({call})"
    if fig.fits is False:
        summary = (f"No fix that fits: keeping the gathered parameters from forward to backward ({call}) would "
                   f"hold about {fig.extra_mib:.0f} MiB more per GPU beside a measured peak of {fig.used_mib:.0f} "
                   f"of {fig.total_mib:.0f} MiB. The re-gathers stay: that memory is what they save.")
    else:
        memory = (f" Each rank then holds about {fig.extra_mib:.0f} MiB more between forward and backward"
                  if fig.extra_mib is not None else " Each rank then holds the unsharded parameters between forward and backward")
        room = (f"; beside the measured peak of {fig.used_mib:.0f} of {fig.total_mib:.0f} MiB it fits."
                if fig.fits else " (ZeRO-2 instead of ZeRO-3): take it where the memory allows.")
        summary = (keep + ": one all-gather per unit a step instead of two"
                   + (f", the loop about {fig.speedup:.2f}x faster." if fig.speedup else ".") + memory + room)
    return Finding(
        rule=FsdpBackwardAllgather.name, title="FSDP gathers the parameters twice a step",
        severity="info" if fig.fits is False else "low",  # "low" is settled from the claims
        claims=claims, evidence=evidence,
        fix=Fix(summary=summary, config=fix.config, snippet=fix.snippet, library=fix.library, call=fix.call),
        data={"rank": fig.rank, "fsdp_version": fig.fsdp, "backward_allgathers_per_step": fig.gathers,
              "backward_allgather_per_step_s": round(fig.gather_s, 4), "gathered_mib_per_step": round(fig.gathered_mib, 2),
              "extra_memory_mib": _r(fig.extra_mib), "peak_gpu_memory_mib": fig.used_mib,
              "gpu_memory_mib": fig.total_mib, "fits": fig.fits, "step_s": _r(fig.step_s),
              "share_of_step": round(fig.share, 4),
              "predicted_loop_speedup": _r(fig.speedup) if fig.fits is not False else None},
    )


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None
