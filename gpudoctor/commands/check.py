"""``gpudoctor check IN --max-waste F``: a CI gate on the wasted fraction.

``--max-waste`` is parsed here (``0.2`` or ``20%``, never a bare 20);
a crashed run fails unless ``--allow-crash`` (then what ran is gated); the report is
validated against its schema on load (:mod:`gpudoctor.report.check`), so a
forged ``wasted_fraction`` of -3 is an invalid report, not a pass. The rule name
printed comes from the file: it is made terminal-safe first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.commands import flags
from gpudoctor.common.termtext import say, terminal_safe
from gpudoctor.common.wording import doctor_fault_words

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report

HELP = "exit 1 when more than a given share of wall time is wasted (a CI gate)"
DESCRIPTION = ("A CI gate: exit 1 when the report's wasted share of wall time is above --max-waste, 0 when it "
               "is at or below it, 2 when the report measured nothing inside the training.")


def waste(text: str) -> float:
    """``--max-waste``: ``0.2`` or ``20%``; a bare number above 1 is refused, never read as a percentage."""
    percent = text.strip().endswith("%")
    value = flags.number(text.strip().removesuffix("%")) / (100 if percent else 1)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    if value > 1:
        hint = "at most 100%" if percent else f"write {text.strip()}% for a percentage, or a fraction such as 0.2"
        raise argparse.ArgumentTypeError(f"{text!r} is above 1 (all of the wall time); {hint}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="run folder or report.json")
    p.add_argument("--max-waste", type=waste, required=True, metavar="FRACTION",
                   help="the most wasted wall time allowed, as a fraction of wall time (0.2) or a "
                   "percentage with %% (20%%); a bare number above 1 is refused")
    p.add_argument("--allow-crash", action="store_true",
                   help="gate a crashed run on what ran before the crash (default: a crash fails)")
    flags.add_debug(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.commands.load import load_report, malformed_report_guard

    report = load_report(args.input)
    with malformed_report_guard(args.input):
        return _gate(report, args.max_waste, args.allow_crash)


def _gate(report: Report, max_waste: float, allow_crash: bool = False) -> int:
    run = report.get("run") or {}
    if run.get("status") == "crashed" and not allow_crash:
        code = run.get("exit_code")
        fault = run.get("doctor_fault")
        how = f" {doctor_fault_words(fault['raised'], fault['frames'], short=True)}" if fault else ""
        say(f"gpudoctor: FAIL: the command crashed (exit code {code if code is not None else 'unknown'}){how}; "
            "the report covers only what ran before it (--allow-crash gates on that part)", file=sys.stderr)
        return 1
    measured = any(v is not None for v in (report.get("breakdown") or {}).values())
    wasted_fraction = report["cost"].get("wasted_fraction")
    if wasted_fraction is None or not measured:
        # Nothing measured inside the training is not a clean bill of health.
        say("gpudoctor: cannot gate: the report measured nothing inside the training (no breakdown); "
            "profile it with 'gpudoctor run -- python train.py' and check that report", file=sys.stderr)
        return 2
    wasted = float(wasted_fraction)
    worst = next((f for f in report["findings"] if f["severity"] != "info"), None)
    if wasted > max_waste:
        top = f"; top: {terminal_safe(worst['rule'])} ({100 * worst['waste_fraction']:.0f}%)" if worst else ""
        say(f"gpudoctor: FAIL: {100 * wasted:.1f}% of wall time wasted > {100 * max_waste:.1f}% allowed{top}",
            file=sys.stderr)
        return 1
    say(f"gpudoctor: OK: {100 * wasted:.1f}% wasted <= {100 * max_waste:.1f}% allowed", file=sys.stderr)
    return 0
