"""The report's first sentence, for one run (report/build.py) and for a multi-node job (report/nodes.py).

Each report computes a :class:`Verdict` (its findings, the settled waste, what was measured); this
module alone words it, so the two reports weigh findings against one threshold (core/thresholds.py) and say the speed-up
one way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpudoctor.common.wording import doctor_fault_words, hours_text, in_sentence, plural
from gpudoctor.core.schema import DoctorFault
from gpudoctor.core.thresholds import LARGE_SHARE, WASTE_SHARE, percent
from gpudoctor.rules import Finding, account


@dataclass(frozen=True)
class Crash:
    """A run that crashed: its exit code, the steps it ran, and gpudoctor's own frame if it raised."""

    exit_code: object
    steps: int
    fault: DoctorFault | None


@dataclass(frozen=True)
class Verdict:
    """What the first sentence weighs. ``share`` gives a bucket's share of wall time for one run;
    a job (``job``: ``"2 nodes, 8 ranks"``) is said by each finding's recovered share alone."""

    findings: Sequence[Finding]  # biggest first
    wasted: float  # the settled share of wall time the fixes recover
    measured: bool  # a training process was measured from inside
    share: Callable[[str], float] | None = None
    crash: Crash | None = None
    job: str = ""


def verdict(v: Verdict) -> str:
    """``2 problems found; the biggest: ... Fixing them could make this run about 1.4x faster.``"""
    real = [f for f in v.findings if f.waste_fraction >= WASTE_SHARE]
    if v.job or v.share is None:
        return _job_verdict(v, real)
    crashed = _crash_words(v.crash)
    share = v.share
    if not v.measured:
        return (crashed + "; " if crashed else "") + (
            "No training process was measured from inside; only host figures are available.")
    compute = share("compute")
    # A finding on a large measured wait (not compute, which is what training is) whose fix recovers little here.
    weak = [f for f in v.findings if f not in real and f.claims and f.claims[0].bucket != "compute"
            and share(f.claims[0].bucket) >= LARGE_SHARE]
    if not real and weak:  # a finding whose measured share is large, though its fix recovers little here
        said = (f"No fix recovers {percent(WASTE_SHARE)} or more of wall time on this machine; the biggest "
                f"finding: {in_sentence(weak[0].title)} ({_measured_and_recovered(share, weak[0])}).")
        return f"{crashed}; in what ran, {said}" if crashed else said
    risk = _risk_words(v.findings)
    none = f"no waste above {percent(WASTE_SHARE)} found"
    if not real:
        if crashed:
            return (f"{crashed}; in what ran, {none} and {100 * compute:.0f}% of wall time "
                    "went to training compute." + risk)
        if risk:  # no waste, but a run that will be killed is not healthy
            return f"{none.capitalize()} ({100 * compute:.0f}% of wall time went to training compute).{risk}"
        return f"Healthy: {none}; {100 * compute:.0f}% of wall time went to training compute."
    found = _found(real, in_sentence(real[0].title), _measured_and_recovered(share, real[0]))
    if crashed:
        return f"{crashed}; in what ran, {found}{risk}"
    return f"{found} {_faster(v.wasted, 'run')}{risk}"


def _job_verdict(v: Verdict, real: list[Finding]) -> str:
    """A merged job: its nodes and ranks said first; each finding by the share its fix recovers."""
    if not v.measured:
        return f"{v.job}: no training process was measured from inside; only host figures are available."
    if not real:
        return f"{v.job}. Healthy: no waste above {percent(WASTE_SHARE)} found on any node."
    found = _found(real, real[0].title, _pct(real[0].waste_fraction))
    return f"{v.job}. {found} {_faster(v.wasted, 'job')}"


def _found(real: list[Finding], title: str, figures: str) -> str:
    return f"{plural(len(real), 'problem')} found; the biggest: {title} ({figures})."


def _faster(wasted: float, what: str) -> str:
    speed = account.speedup(wasted) or 1.0
    return f"Fixing them could make this {what} about {speed:.1f}x faster."


def _risk_words(findings: Sequence[Finding]) -> str:
    """`` Memory grows steadily: the run will run out of it in about 3.5 hours at this rate.``: a risk
    finding (no waste, a deadline) said in the verdict, which otherwise weighs only wasted time."""
    words = ""
    for f in findings:
        if f.risk and f.severity != "info":
            left = f.data.get("hours_left")
            words += " " + f.title + (f", in about {hours_text(left)} at this rate." if isinstance(left, float) else ".")
    return words


def _measured_and_recovered(share: Callable[[str], float], f: Finding) -> str:
    """``data_wait is 79% of wall time; the fix recovers 12% on this machine``: the measured share
    and the part of it the fix gives back, said apart so neither reads as the other."""
    recovered = f"the fix recovers {_pct(f.waste_fraction)} of wall time on this machine"
    if not f.claims:
        return recovered
    c = f.claims[0]
    # the figures as the report writes them (4 decimals) and the finding's line then says them: one
    # figure (the unrounded 0.61496 read "61%" here and, through the report's 0.615, "62%" there)
    measured = round(share(c.bucket), 4)
    figure = 100 * measured * round(c.part_share, 4) if c.part else 100 * measured  # a part: only what it is made of
    if not figure:
        return recovered
    name = f"{c.bucket} ({c.part.replace('_', ' ')})" if c.part else c.bucket
    return f"{name} is {figure:.0f}% of wall time; {recovered}"


def _pct(share: float) -> str:
    """A share as the report writes it (4 decimals) and the terminal then says it: one figure."""
    return f"{100 * round(share, 4):.0f}%"


def _crash_words(crash: Crash | None) -> str:
    """``Crashed (exit code 1) after 59 steps: the report covers the 50.6 s it ran``, or ""."""
    if crash is None:
        return ""
    code, steps, fault = crash.exit_code, crash.steps, crash.fault
    how = f"exit code {code}" if isinstance(code, int) and not isinstance(code, bool) else "exit code unknown"
    # gpudoctor's code in the traceback: said before the figures, never read as the command's own failure
    ours = f", {doctor_fault_words(fault['raised'], fault['frames'], short=True)}. The" if fault is not None else ": the"
    return (f"Crashed ({how}) after {steps} training step{'' if steps == 1 else 's'}{ours} figures cover "
            "what ran before the crash, not a whole run")
