"""``gpudoctor check IN --max-waste F | --baseline REF [--max-slowdown F]``: a CI gate.

``--max-waste`` gates the wasted share of wall time; ``--baseline`` (``last``, a history id or a
``--name``) gates against an earlier run from the history (:mod:`gpudoctor.history.baseline`):
steps/s may fall, and the wasted share rise (in points of wall time), by at most ``--max-slowdown``.
Both bounds are parsed here (``0.05`` or ``5%``, never a bare 5); a crashed run fails unless
``--allow-crash`` (then what ran is gated); the report is validated against its schema on load
(:mod:`gpudoctor.report.check`), so a forged ``wasted_fraction`` of -3 is an invalid report, not
a pass. Every string printed from a report or the history is made terminal-safe first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.commands import flags
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say, terminal_safe
from gpudoctor.common.wording import doctor_fault_words

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report
    from gpudoctor.history.baseline import Comparison
    from gpudoctor.history.entry import Entry

HELP = "exit 1 when too much wall time is wasted, or the run is slower than a baseline (a CI gate)"
DESCRIPTION = ("A CI gate: exit 1 when the report's wasted share of wall time is above --max-waste, or when, "
               "against --baseline (an earlier run from 'gpudoctor history'), steps/s fell or the wasted share "
               "rose by more than --max-slowdown; 0 when within; 2 when the report measured nothing inside the "
               "training.")
DEFAULT_MAX_SLOWDOWN = 0.05


def _share(text: str, whole: str) -> float:
    """``0.2`` or ``20%``; a bare number above 1 is refused, never read as a percentage."""
    percent = text.strip().endswith("%")
    value = flags.number(text.strip().removesuffix("%")) / (100 if percent else 1)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    if value > 1:
        hint = "at most 100%" if percent else f"write {text.strip()}% for a percentage, or a fraction such as 0.2"
        raise argparse.ArgumentTypeError(f"{text!r} is above 1 ({whole}); {hint}")
    return value


def waste(text: str) -> float:
    """``--max-waste``: a share of wall time."""
    return _share(text, "all of the wall time")


def slowdown(text: str) -> float:
    """``--max-slowdown``: a share of the baseline's steps/s (and points of wasted wall time)."""
    return _share(text, "a run that made no progress")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help="run folder or report.json, or a history id or --name")
    p.add_argument("--max-waste", type=waste, default=None, metavar="FRACTION",
                   help="the most wasted wall time allowed, as a fraction of wall time (0.2) or a "
                   "percentage with %% (20%%); a bare number above 1 is refused")
    p.add_argument("--baseline", default=None, metavar="last|ID|NAME",
                   help="gate against an earlier run from the history: 'last' (the newest earlier run of the "
                   "same script), an id, or a --name (see gpudoctor history)")
    p.add_argument("--max-slowdown", type=slowdown, default=None, metavar="FRACTION",
                   help="with --baseline: how far steps/s may fall below the baseline's, and the wasted share "
                   f"rise above it in points of wall time (default {100 * DEFAULT_MAX_SLOWDOWN:.0f}%%)")
    p.add_argument("--allow-crash", action="store_true",
                   help="gate a crashed run on what ran before the crash (default: a crash fails)")
    flags.add_history(p, writes=False)
    flags.add_debug(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.commands.load import load_report, malformed_report_guard, report_source

    if args.max_slowdown is not None and args.baseline is None:
        raise UserError("--max-slowdown bounds the change from a baseline: add --baseline last|ID|NAME")
    if args.max_waste is None and args.baseline is None:
        raise UserError("nothing to gate on: give --max-waste FRACTION, --baseline last|ID|NAME, or both; "
                        "see 'gpudoctor check --help'")
    where = flags.history_location(args)
    source = report_source(args.input, where)
    report = load_report(source)
    with malformed_report_guard(source):
        crashed = _crashed(report, args.allow_crash)
        if crashed:
            return crashed
        codes = []
        if args.max_waste is not None:
            codes.append(_gate(report, args.max_waste))
        if args.baseline is not None:
            bound = DEFAULT_MAX_SLOWDOWN if args.max_slowdown is None else args.max_slowdown
            codes.append(_against(report, source, args.baseline, bound, where))
    return 1 if 1 in codes else max(codes)


def _crashed(report: Report, allow_crash: bool) -> int:
    run = report.get("run") or {}
    if run.get("status") != "crashed" or allow_crash:
        return 0
    code = run.get("exit_code")
    fault = run.get("doctor_fault")
    how = f" {doctor_fault_words(fault['raised'], fault['frames'], short=True)}" if fault else ""
    say(f"gpudoctor: FAIL: the command crashed (exit code {code if code is not None else 'unknown'}){how}; "
        "the report covers only what ran before it (--allow-crash gates on that part)", file=sys.stderr)
    return 1


def _gate(report: Report, max_waste: float) -> int:
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


def _against(report: Report, source: Path, ref: str, bound: float, where: Path | None) -> int:
    """The baseline gate: one line, FAIL with by how much, OK, or why it cannot judge (2)."""
    from gpudoctor.history.baseline import compare, find_baseline
    from gpudoctor.history.entry import from_report
    from gpudoctor.history.store import History

    if where is None:
        raise UserError("--baseline reads the run history, which GPUDOCTOR_HISTORY=off turns off; "
                        "pass --history PATH")
    current = from_report(report, source if source.is_dir() else source.parent, git=False)
    with History(where, create=False) as history:
        c = compare(current, find_baseline(history, ref, current))
    base = _named(c.baseline)
    if c.slowdown is None:
        which = "this run" if current.steps_per_s is None else base
        say(f"gpudoctor: cannot gate against {base}: {which} has no steps/s (no training step timed); "
            "name a baseline that has (see gpudoctor history)", file=sys.stderr)
        return 2
    failed = [w for w, bad in ((_slower_words(c), c.slower(bound)), (_waste_words(c), c.wastes_more(bound))) if bad]
    if failed:
        say(f"gpudoctor: FAIL against {base}: {'; '.join(failed)} > {100 * bound:.1f}% allowed", file=sys.stderr)
        return 1
    waste = f", {_waste_words(c)}" if c.waste_rise is not None else ""
    say(f"gpudoctor: OK against {base}: {_slower_words(c)}{waste}; within {100 * bound:.1f}% allowed",
        file=sys.stderr)
    return 0


def _named(e: Entry) -> str:
    name = f" {terminal_safe(e.name, 40)!r}" if e.name else ""
    return f"#{e.id}{name} ({time.strftime('%Y-%m-%d %H:%M', time.localtime(e.time))})"


def _slower_words(c: Comparison) -> str:
    now, before = c.current.steps_per_s or 0.0, c.baseline.steps_per_s or 0.0
    slowdown = c.slowdown or 0.0
    how = f"{100 * slowdown:.1f}% slower" if slowdown >= 0 else f"{-100 * slowdown:.1f}% faster"
    return f"{now:.3g} steps/s vs {before:.3g}, {how}"


def _waste_words(c: Comparison) -> str:
    now, before, rise = c.current.waste or 0.0, c.baseline.waste or 0.0, c.waste_rise or 0.0
    return f"waste {100 * now:.1f}% of wall time vs {100 * before:.1f}%, {100 * rise:+.1f} points"
