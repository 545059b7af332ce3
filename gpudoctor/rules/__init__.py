"""Rules: turn an Analysis into findings with evidence, fixes and predicted speedups."""

from gpudoctor.rules.base import Finding, Fix, Rule, all_rules, register, settle_findings

__all__ = ["Finding", "Fix", "Rule", "all_rules", "register", "run_rules"]


def run_rules(analysis):  # type: ignore[no-untyped-def]
    """Every rule that matches, largest waste first, and the wasted fraction of all of them together.

    Each finding's waste is its claims on the breakdown settled alone; the total settles every
    claim at once (see :mod:`gpudoctor.rules.account`), so it is never a plain sum.
    """
    from gpudoctor.rules import script_flags

    findings = [f for rule in all_rules() if (f := rule.match(analysis)) is not None]
    wasted = settle_findings(analysis.breakdown(), findings)
    script_flags.apply(analysis, findings)  # each fix also in the script's own flags, where it has them
    return sorted(findings, key=lambda f: -f.waste_fraction), wasted
