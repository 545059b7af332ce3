"""Memory over the loop: growth that will kill the run, and the peak of a fix that changes the work.

``memory_growth`` is not a waste of time (its claims are none) but a risk with a deadline: its
severity is set by the hours left at the measured rate (under a day: high), never settled from
claims (:attr:`Finding.risk`). On CUDA the allocator's figures name what grows (tensors kept, or the
cache). The trends are :mod:`gpudoctor.analysis.memory`'s, and so is the split of the step's peak
that :func:`fix_memory` turns into the predicted peak of a larger batch or shorter rows.
"""

from __future__ import annotations

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.memory import (
    MIN_GROWTH_MIB,
    MIN_GROWTH_SHARE,
    MIN_R2,
    SAFE_SHARE,
    SOON_H,
    StepMemory,
    Trend,
    allocator,
    gpu_kind,
    step_memory,
    trends,
)
from gpudoctor.common.wording import hours_text
from gpudoctor.core import schema
from gpudoctor.rules.base import Finding, Fix, Rule

HIGH_WITHIN_H = 24.0  # running out within a day of training is high severity

_KIND = {
    "host": ("the training processes' resident memory (main process and DataLoader workers)",
             "something kept across steps on the host: a Python list of tensors (losses or outputs that "
             "still hold their autograd graph), or a Dataset that caches items (each DataLoader worker "
             "keeps its own copy)"),
    "gpu": ("the training processes' GPU memory",
            "tensors kept across steps on the GPU: a list of losses or outputs with their graphs, or a tensor "
            "carried from one step to the next that makes the autograd graph longer every step"),
    "cuda_allocated": ("the CUDA allocator's allocated memory (live tensors)",
                       "tensors kept across steps on the GPU: a list of losses or outputs with their graphs, or a "
                       "tensor carried from one step to the next that makes the autograd graph longer every step"),
    "cuda_reserved": ("the CUDA allocator's reserved memory (live tensors and cached blocks)",
                      "cached blocks, not live tensors (allocated stays flat): the allocator keeps blocks of "
                      "ever-new sizes (inputs whose shape changes every step) it cannot reuse: fragmentation"),
}
_GPU_LIKELY = {"tensors": "cuda_allocated", "cache": "cuda_reserved"}
_SNIPPET = ("losses.append(loss.item())        # a float, not loss: a tensor holds its whole graph\n"
            "history.append(output.detach().cpu())  # keep values, never the graph\n"
            "# GPU: print(torch.cuda.memory_summary()) after a few steps names what grows")


class MemoryGrowth(Rule):
    name = "memory_growth"
    fires_when = (f"host RSS of the training tree or its GPU memory grows along a line over the loop (R² ≥ {MIN_R2}, "
                  f"still growing in its second half, by ≥ {MIN_GROWTH_MIB:.0f} MiB and ≥ {MIN_GROWTH_SHARE:.0%} or "
                  f"running out within {SOON_H:.0f} h)")
    fix_from = ("the growth per hour and the memory left at the last sample (host available, GPU free): the hours "
                f"until it runs out (high severity under {HIGH_WITHIN_H:.0f} h); the likely kind from where it grows")

    def match(self, a: Analysis) -> Finding | None:
        steady = [t for t in trends(a) if t.steady]
        kind = gpu_kind(steady)
        # the GPU said once: NVML's figure where it grows, the allocator's to name the kind
        shown = [t for t in steady if t.what in ("host", "gpu")] or steady
        if not shown:
            return None
        worst = min(shown, key=lambda t: t.hours_left if t.hours_left is not None else float("inf"))
        return _word(worst, [t for t in shown if t is not worst], kind, _beside_nvml(a, steady))


def _beside_nvml(a: Analysis, steady: list[Trend]) -> dict[str, float | None] | None:
    """The allocator's last figures beside NVML's per-process one, and the allocator's growth."""
    samples = allocator(a)
    if not samples:
        return None
    last = samples[-1]
    rate = {t.what: round(t.slope_mib_per_h, 1) for t in steady}
    nvml = [v for r in a.rec.gpu for g in r.get("gpus") or [] if isinstance(g, dict)
            and isinstance(v := g.get("proc_mem_mib"), (int, float)) and not isinstance(v, bool)]
    return {"allocated_mib": round(last.allocated_mib, 1), "reserved_mib": round(last.reserved_mib, 1),
            "peak_mib": round(max(s.peak_mib for s in samples), 1),
            "nvml_proc_mib": round(float(nvml[-1]), 1) if nvml else None,
            "allocated_growth_mib_per_hour": rate.get("cuda_allocated"),
            "reserved_growth_mib_per_hour": rate.get("cuda_reserved")}


def _word(t: Trend, others: list[Trend], kind: str | None,
          cuda: dict[str, float | None] | None) -> Finding:
    what, likely = _KIND[t.what]
    if t.what != "host" and kind is not None:
        likely = _KIND[_GPU_LIKELY[kind]][1]
    left = t.hours_left
    when = (f"At this rate {t.limit_what} ({t.limit_mib:,.0f} MiB at the last sample) is used up in "
            f"{_hours(left)} of training" if left is not None and t.limit_mib is not None
            else "How much it can still grow was not recorded")
    evidence = (f"Over the {t.loop_s:.0f} s training loop, {what} grew steadily from {t.start_mib:,.0f} to "
                f"{t.end_mib:,.0f} MiB: {t.slope_mib_per_h:,.0f} MiB an hour ({t.samples} samples on a line, "
                f"R² {t.r2:.2f}; the second half grew {t.late_ratio:.1f}x as fast as the whole). {when}. "
                f"Likely {likely}.")
    if others:
        o = others[0]
        evidence += f" {_KIND[o.what][0].capitalize()} grew too: {o.slope_mib_per_h:,.0f} MiB an hour."
    if cuda is not None and t.what != "host":
        evidence += " " + _allocator_words(cuda)
    if t.what != "host" and kind == "cache":
        summary = ("Give the allocator fewer shapes to cache: pad or bucket inputs to a few fixed lengths, or set "
                   "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`")
    else:
        summary = ("Find what the loop keeps from step to step and keep plain values instead: "
                   + ("`loss.item()` or `.detach()` rather than the tensor, and no per-item cache in the Dataset"
                      if t.what == "host" else "`.detach()` whatever outlives its step"))
    summary += f"; until then this run is killed after about {_hours(left)}." if left is not None else "."
    finding = Finding(
        rule=MemoryGrowth.name,
        title="Memory grows steadily: the run will run out of it",
        evidence=evidence,
        fix=Fix(summary=summary, snippet=_SNIPPET),
        data={"where": "host" if t.what == "host" else "gpu", "kind": "host" if t.what == "host" else kind,
              "growth_mib_per_hour": round(t.slope_mib_per_h, 1),
              "start_mib": round(t.start_mib, 1), "end_mib": round(t.end_mib, 1), "r2": round(t.r2, 4),
              "late_slope_ratio": round(t.late_ratio, 3), "samples": t.samples, "loop_s": round(t.loop_s, 3),
              "headroom_mib": round(t.limit_mib, 1) if t.limit_mib is not None else None,
              "hours_left": round(left, 2) if left is not None else None,
              **({"cuda_allocator": cuda} if cuda is not None else {})},
        risk=True,
    )
    finding.severity = "high" if left is not None and left < HIGH_WITHIN_H else "medium"
    return finding


def _hours(h: float | None) -> str:
    return "an unknown time" if h is None else hours_text(h)


def _allocator_words(c: dict[str, float | None]) -> str:
    grew = [f"{name} {rate:,.0f} MiB an hour" for name, rate in (("allocated", c["allocated_growth_mib_per_hour"]),
                                                                  ("reserved", c["reserved_growth_mib_per_hour"]))
            if rate is not None]
    nvml = f", NVML's per-process figure {c['nvml_proc_mib']:,.0f} MiB" if c["nvml_proc_mib"] is not None else ""
    return (f"The CUDA allocator at the last step end: {c['allocated_mib']:,.0f} MiB allocated, "
            f"{c['reserved_mib']:,.0f} MiB reserved (peak allocated {c['peak_mib']:,.0f} MiB){nvml}; "
            + (f"growing: {', '.join(grew)}." if grew else "neither grew along a line."))


# ---- the predicted peak of a fix that changes the work per step --------------------------------
def unmeasured(a: Analysis) -> str:
    """Why a fix's peak cannot be predicted on this run."""
    cfg = a.primary.torch_cfg if a.primary is not None else None
    if not cfg or cfg.get("device") != "cuda":
        return "unavailable on a CPU run: no CUDA allocator to measure the activations per sample"
    return "the CUDA allocator's figures were not recorded (hooks off, or a recording made before they were)"


def fix_memory(a: Analysis, mem: StepMemory | None, scale: float, per: str = "rows") -> schema.FixMemory:
    """The fix's predicted peak (the work per step × ``scale``) and the headroom left, or why not."""
    if mem is None:
        return {"predicted_peak_mib": None, "headroom_mib": None, "limit_mib": None, "basis": unmeasured(a)}
    size = mem.rows if per == "rows" else mem.tokens
    each = (f"{mem.activation_mib / size:,.2f} MiB per {'sample' if per == 'rows' else 'token'} of "
            f"{size:,} in the widest batch" if size else "the widest batch's")
    basis = (f"measured: {mem.static_mib:,.0f} MiB held across steps + {scale:g} × {mem.activation_mib:,.0f} MiB of "
             f"activations ({each}); the limit is {SAFE_SHARE:.0%} of the device's {mem.total_mib:,.0f} MiB"
             + (f" less {mem.overhead_mib:,.0f} MiB of CUDA context" if mem.overhead_mib >= 1 else ""))
    return {"predicted_peak_mib": round(mem.predicted_peak_mib(scale), 1),
            "headroom_mib": round(mem.headroom_mib(scale), 1), "limit_mib": round(mem.limit_mib, 1),
            "basis": basis}


MAX_BATCH_FACTOR = 64  # a batch × k beyond this is a different training, whatever the memory says


def batch_factor_that_fits(a: Analysis, factor: int) -> tuple[int, StepMemory | None]:
    """The largest batch × k whose peak, predicted from the activations measured per sample, fits
    (1: not even × 2, so no larger batch may be prescribed); where they were not measured, ``factor``
    (NVML's guess, which takes all of the memory seen to grow with the batch)."""
    mem = step_memory(a)
    if mem is None:
        return factor, mem
    return mem.largest_factor(MAX_BATCH_FACTOR), mem
