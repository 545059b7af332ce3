"""Memory that grows steadily over the training loop: a run that will be killed, and when.

Not a waste of time (its claims are none) but a risk with a deadline: its severity is set by the
hours left at the measured rate (under a day: high), never settled from claims
(:attr:`Finding.risk`). The trend is :mod:`gpudoctor.analysis.memory`'s.
"""

from __future__ import annotations

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.memory import (
    MIN_GROWTH_MIB,
    MIN_GROWTH_SHARE,
    MIN_R2,
    SOON_H,
    Trend,
    trends,
)
from gpudoctor.common.wording import hours_text
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
}
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
        if not steady:
            return None
        worst = min(steady, key=lambda t: t.hours_left if t.hours_left is not None else float("inf"))
        return _word(worst, steady)


def _word(t: Trend, all_steady: list[Trend]) -> Finding:
    what, likely = _KIND[t.what]
    left = t.hours_left
    when = (f"At this rate {t.limit_what} ({t.limit_mib:,.0f} MiB at the last sample) is used up in "
            f"{_hours(left)} of training" if left is not None and t.limit_mib is not None
            else "How much it can still grow was not recorded")
    evidence = (f"Over the {t.loop_s:.0f} s training loop, {what} grew steadily from {t.start_mib:,.0f} to "
                f"{t.end_mib:,.0f} MiB: {t.slope_mib_per_h:,.0f} MiB an hour ({t.samples} samples on a line, "
                f"R² {t.r2:.2f}; the second half grew {t.late_ratio:.1f}x as fast as the whole). {when}. "
                f"Likely {likely}.")
    others = [o for o in all_steady if o is not t]
    if others:
        o = others[0]
        evidence += f" {_KIND[o.what][0].capitalize()} grew too: {o.slope_mib_per_h:,.0f} MiB an hour."
    summary = ("Find what the loop keeps from step to step and keep plain values instead: "
               + ("`loss.item()` or `.detach()` rather than the tensor, and no per-item cache in the Dataset"
                  if t.what == "host" else "`.detach()` whatever outlives its step")
               + (f"; until then this run is killed after about {_hours(left)}." if left is not None else "."))
    finding = Finding(
        rule=MemoryGrowth.name,
        title="Memory grows steadily: the run will run out of it",
        evidence=evidence,
        fix=Fix(summary=summary, snippet=_SNIPPET),
        data={"where": t.what, "growth_mib_per_hour": round(t.slope_mib_per_h, 1),
              "start_mib": round(t.start_mib, 1), "end_mib": round(t.end_mib, 1), "r2": round(t.r2, 4),
              "late_slope_ratio": round(t.late_ratio, 3), "samples": t.samples, "loop_s": round(t.loop_s, 3),
              "headroom_mib": round(t.limit_mib, 1) if t.limit_mib is not None else None,
              "hours_left": round(left, 2) if left is not None else None},
        risk=True,
    )
    finding.severity = "high" if left is not None and left < HIGH_WITHIN_H else "medium"
    return finding


def _hours(h: float | None) -> str:
    return "an unknown time" if h is None else hours_text(h)
