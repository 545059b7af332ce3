"""The rules that run, in order: one explicit list, so a rule is never silently left out.

``tests/test_catalog.py`` fails when a :class:`~gpudoctor.rules.base.Rule` subclass in
``gpudoctor/rules/`` is missing here, or two rules share a name.
"""

from __future__ import annotations

from gpudoctor.analysis import Analysis
from gpudoctor.rules import script_flags
from gpudoctor.rules.base import Finding, Rule, settle_findings
from gpudoctor.rules.batches import PaddingWaste
from gpudoctor.rules.communication import (
    ExposedCommunication,
    FsdpBackwardAllgather,
    SyncEveryMicrostep,
    UnusedParameterSearch,
)
from gpudoctor.rules.data import CpuSaturated, DataStall, IoBound, TokenizationInLoop
from gpudoctor.rules.evaluation import EvalOverhead
from gpudoctor.rules.gpu import (
    GpuMemoryUnderused,
    LowGpuUtilization,
    NoMixedPrecision,
    NoTf32,
    SmallBatch,
)
from gpudoctor.rules.gpu_clock import HostSync, LowMfu
from gpudoctor.rules.memory import MemoryGrowth
from gpudoctor.rules.nodes import StragglerNode
from gpudoctor.rules.ranks import OutdatedLibraries, StragglerRank
from gpudoctor.rules.saving import CheckpointOverhead
from gpudoctor.rules.startup import StartupIdle

RULES: tuple[type[Rule], ...] = (
    TokenizationInLoop,
    DataStall,
    IoBound,
    CpuSaturated,
    PaddingWaste,
    CheckpointOverhead,
    EvalOverhead,
    StartupIdle,
    LowGpuUtilization,
    HostSync,
    LowMfu,
    SmallBatch,
    GpuMemoryUnderused,
    NoTf32,
    NoMixedPrecision,
    SyncEveryMicrostep,
    UnusedParameterSearch,
    ExposedCommunication,
    FsdpBackwardAllgather,
    StragglerRank,
    StragglerNode,
    OutdatedLibraries,
    MemoryGrowth,
)


def all_rules() -> list[Rule]:
    return [cls() for cls in RULES]


def run_rules(analysis: Analysis) -> tuple[list[Finding], float]:
    """Every rule that matches, largest waste first, and the wasted fraction of all of them together.

    Each finding's waste is its claims on the breakdown settled alone; the total settles every
    claim at once (see :mod:`gpudoctor.rules.account`), so it is never a plain sum.
    """
    findings = [f for rule in all_rules() if (f := rule.match(analysis)) is not None]
    # each fix also in the script's own flags, where it has them (a switch that caches whole items
    # gives back more than pre-tokenizing: its claims), then every claim settled
    script_flags.apply(analysis, findings)
    wasted = settle_findings(analysis.breakdown(), findings)
    return sorted(findings, key=lambda f: -f.waste_fraction), wasted


def rules_table() -> str:
    """The README's rules table, from the catalog (tests/test_catalog.py keeps the README equal)."""
    rows = ["| rule | fires when | the fix is computed from |", "|---|---|---|"]
    rows += [f"| `{cls.name}` | {cls.fires_when} | {cls.fix_from} |" for cls in RULES]
    return "\n".join(rows)
