"""Rules as small objects (the shape of torch.profiler's pattern matcher).

Each rule has a ``name`` (a SPEC rule name), ``fires_when`` and ``fix_from`` (the
README's rules table) and ``match(analysis) -> Finding | None``. The rules that run are listed, in order, in
:mod:`gpudoctor.rules.catalog` (a test checks that no rule class is left out).

A finding states what its fix gives back as :class:`~gpudoctor.rules.account.Claim`s
on the breakdown's buckets; its ``waste_fraction``, ``severity`` and
``predicted_speedup`` are settled from them (:func:`settle_findings`), the same way
for every rule.

One definition: the report's TypedDicts (:mod:`gpudoctor.core.schema`: ``FixTable``, ``Fix``,
``Finding``, ``Claim``) say what a finding is. The dataclasses here are the rules' working values of
the same fields (mutable: the claims are settled, and :mod:`gpudoctor.rules.script_flags` adds the
script's flags after every rule ran), each with one ``to_dict`` that writes every schema key (mypy
holds its types to the schema's). They add only what settles a figure and is not written
(:data:`SETTLED_ONLY`); the report adds only what is worked out from the settled figures and the
price (:data:`REPORT_ONLY`). ``tests/test_finding_schema.py`` holds the field names equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpudoctor.analysis import Analysis
from gpudoctor.core import schema
from gpudoctor.rules import account
from gpudoctor.rules.account import Claim

# The library a fix names when the knob is the training loop's own code (a hand-written loop's save
# or eval interval): what ``try`` recognises such a table by (tryfix/plan.py), one constant, not a phrase.
LOOP_LIBRARY = "your training loop"


@dataclass
class Table:
    """The arguments a fix changes in one call of one library, as literals that paste into it
    (:class:`gpudoctor.core.schema.FixTable`, field for field)."""

    library: str  # what the names belong to, e.g. "transformers 5.23.0 TrainingArguments"
    call: str | None  # how that call is spelled in code ("TrainingArguments", "ds.map"); None: plain settings
    config: dict[str, Any]

    def to_dict(self) -> schema.FixTable:
        return {"library": self.library, "call": self.call, "config": self.config}

    @staticmethod
    def main_and_also(tables: list[Table]) -> dict[str, Any]:
        """``Fix`` keyword arguments: the first table with values is the main one, the rest ``also``."""
        kept = [t for t in tables if t.config]
        if not kept:
            return {}
        main = kept[0]
        return {"config": main.config, "library": main.library, "call": main.call, "also": kept[1:]}


@dataclass
class Fix:
    """A finding's fix: :class:`gpudoctor.core.schema.Fix`, field for field."""

    summary: str
    config: dict[str, Any] = field(default_factory=dict)  # arguments of ``library``'s ``call``
    snippet: str | None = None
    library: str | None = None
    call: str | None = None
    also: list[Table] = field(default_factory=list)  # other calls the fix changes, one table each
    memory: schema.FixMemory | None = None  # the predicted peak, on fixes that change the work per step

    def to_dict(self) -> schema.Fix:
        """The report's ``fix`` (:class:`gpudoctor.core.schema.Fix`)."""
        out: schema.Fix = {
            "summary": self.summary,
            "config": self.config,
            "snippet": self.snippet,
            "library": self.library,
            "call": self.call,
            "also": [t.to_dict() for t in self.also],
        }
        if self.memory is not None:
            out["memory"] = self.memory
        return out


# Fields of :class:`Finding` that settle the report's figures and are not written themselves.
SETTLED_ONLY = frozenset({"speedup_up_to", "per_launch_s", "switch_claims"})
# Keys of the report's finding that ``Finding.to_dict`` works out from the settled figures and the price.
REPORT_ONLY = frozenset({"waste_usd_per_hour", "predicted_speedup_range"})


@dataclass
class Finding:
    """A rule's finding: :class:`gpudoctor.core.schema.Finding`'s fields, less :data:`REPORT_ONLY`,
    plus :data:`SETTLED_ONLY`."""

    rule: str
    title: str
    evidence: str
    fix: Fix
    claims: list[Claim] = field(default_factory=list)
    severity: schema.Severity = "low"  # settled from the claims; "info" findings claim nothing
    waste_fraction: float = 0.0  # share of wall time the claims give back, settled alone
    predicted_speedup: float | None = None  # steady-state steps/s after over before, from the conservative claims
    whole_run_speedup: float | None = None  # the recording's wall time before over after, startup included
    speedup_up_to: float | None = None  # the optimistic end, when the gain depends on the unmeasured
    data: dict[str, Any] = field(default_factory=dict)
    per_launch_s: float | None = None  # seconds each launch repeats (priced per launch when priced)
    risk: bool = False  # a risk, not a waste (memory that runs out): its rule sets the severity, no claims
    # what the fix gives back when the script's own switch does more than the fix names: "cache"
    # (each whole item computed once) where a pre-tokenizing fix meets a --precompute/--cache switch
    switch_claims: dict[str, list[Claim]] = field(default_factory=dict)

    def to_dict(self, usd_per_hour: float | None) -> schema.Finding:
        """The report's finding (:class:`gpudoctor.core.schema.Finding`): the figures settled, rounded."""
        waste_usd = usd_per_hour * self.waste_fraction if usd_per_hour is not None else None
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "waste_fraction": round(self.waste_fraction, 4),
            "waste_usd_per_hour": round(waste_usd, 4) if waste_usd is not None else None,
            "evidence": self.evidence,
            "data": {**self.data, **({"usd_per_launch": round(self.per_launch_s / 3600 * usd_per_hour, 4)}
                                     if self.per_launch_s is not None and usd_per_hour is not None else {})},
            "fix": self.fix.to_dict(),
            "predicted_speedup": round(self.predicted_speedup, 3) if self.predicted_speedup else None,
            "whole_run_speedup": round(self.whole_run_speedup, 3) if self.whole_run_speedup else None,
            "predicted_speedup_range": (
                [round(self.predicted_speedup or 1.0, 3), round(self.speedup_up_to, 3)]
                if self.speedup_up_to is not None else None),
            "claims": [c.to_dict() for c in self.claims],
            "risk": self.risk,
        }


class Rule:
    name: ClassVar[str]
    fires_when: ClassVar[str]  # the README's rules table is generated from these (catalog.rules_table)
    fix_from: ClassVar[str]

    def match(self, a: Analysis) -> Finding | None:
        raise NotImplementedError


def severity_for(waste_fraction: float) -> schema.Severity:
    if waste_fraction >= 0.2:
        return "high"
    if waste_fraction >= 0.08:
        return "medium"
    return "low"


def settle_findings(shares: dict[str, float | None], findings: list[Finding]) -> float:
    """Settle each finding's claims alone (its waste, severity, speedups) and all together.

    ``waste_fraction`` (and the money) is a share of the whole recording; ``predicted_speedup`` is
    the training loop's steady-state steps/s after over before (:func:`account.steady_speedup`:
    what ``try`` measures and a long run gets); ``whole_run_speedup`` is this recording's wall
    before over after, startup included. Returns the report's wasted fraction: every claim
    applied at once, compounded per bucket.
    """
    for f in findings:
        if f.severity == "info" or f.risk:
            continue
        f.waste_fraction = account.wasted_share(shares, f.claims)
        f.whole_run_speedup = account.speedup(f.waste_fraction)
        f.predicted_speedup = account.steady_speedup(shares, f.claims)
        if any(c.up_to is not None for c in f.claims):
            best = account.steady_speedup(shares, [c.optimistic() for c in f.claims])
            f.speedup_up_to = best if best and best > (f.predicted_speedup or 1.0) + 5e-4 else None
        f.severity = severity_for(f.waste_fraction)
    return account.wasted_share(shares, (c for f in findings for c in f.claims))


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
