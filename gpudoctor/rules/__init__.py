"""Rules: turn an Analysis into findings with evidence, fixes and predicted speedups."""

from gpudoctor.rules.base import Finding, Fix, Rule, all_rules, register

__all__ = ["Finding", "Fix", "Rule", "all_rules", "register", "run_rules"]


def run_rules(analysis):  # type: ignore[no-untyped-def]
    """Every rule that matches, largest waste first."""
    findings = [f for rule in all_rules() if (f := rule.match(analysis)) is not None]
    return sorted(findings, key=lambda f: -f.waste_fraction)
