"""Rules: turn an Analysis into findings with evidence, fixes and predicted speedups."""

from gpudoctor.rules.base import Finding, Fix, Rule
from gpudoctor.rules.catalog import RULES, all_rules, run_rules

__all__ = ["RULES", "Finding", "Fix", "Rule", "all_rules", "run_rules"]
