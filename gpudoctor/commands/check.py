"""``gpudoctor check IN --max-waste F``: a CI gate on the wasted fraction.

``--max-waste`` is parsed in :mod:`gpudoctor.cli` (``0.2`` or ``20%``, never a bare 20);
a crashed run fails unless ``--allow-crash`` (then what ran is gated); the report is
validated against its schema on load (:mod:`gpudoctor.report.check`), so a
forged ``wasted_fraction`` of -3 is an invalid report, not a pass. The rule name
printed comes from the file: it is made terminal-safe first.
"""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.commands.load import load_report, malformed_report_guard
from gpudoctor.common.termtext import terminal_safe


def main(args: Any) -> int:
    report = load_report(args.input)
    with malformed_report_guard(args.input):
        return _gate(report, args.max_waste, bool(getattr(args, "allow_crash", False)))


def _gate(report: dict[str, Any], max_waste: float, allow_crash: bool = False) -> int:
    run = report.get("run") or {}
    if run.get("status") == "crashed" and not allow_crash:
        code = run.get("exit_code")
        print(f"gpudoctor: FAIL: the command crashed (exit code {code if code is not None else 'unknown'}); "
              "the report covers only what ran before it (--allow-crash gates on that part)", file=sys.stderr)
        return 1
    measured = any(v is not None for v in (report.get("breakdown") or {}).values())
    if report["cost"].get("wasted_fraction") is None or not measured:
        # Nothing measured inside the training is not a clean bill of health.
        print("gpudoctor: cannot gate: the report measured nothing inside the training (no breakdown); "
              "profile it with 'gpudoctor run -- python train.py' and check that report", file=sys.stderr)
        return 2
    wasted = float(report["cost"]["wasted_fraction"])
    worst = next((f for f in report["findings"] if f["severity"] != "info"), None)
    if wasted > max_waste:
        top = f"; top: {terminal_safe(worst['rule'])} ({100 * worst['waste_fraction']:.0f}%)" if worst else ""
        print(f"gpudoctor: FAIL: {100 * wasted:.1f}% of wall time wasted > {100 * max_waste:.1f}% allowed{top}",
              file=sys.stderr)
        return 1
    print(f"gpudoctor: OK: {100 * wasted:.1f}% wasted <= {100 * max_waste:.1f}% allowed", file=sys.stderr)
    return 0
