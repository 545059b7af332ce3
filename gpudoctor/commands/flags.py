"""What several commands' flags share: the value parsers and the common options, each defined once.

A bad value is refused by argparse before any child starts; the message says what the value must
be (``'0' must be >= 1``) and :mod:`gpudoctor.cli` prints it as one line. Stdlib only:
``gpudoctor --help`` builds every command's flags.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report

MIN_INTERVAL_S = 0.01  # 100 Hz: below it the samplers would spin a core, not measure better


def number(text: str) -> float:
    """A finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (a price: 0 is a free GPU)."""
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (seconds, rates: 0 would mean never, or divide by zero)."""
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def interval(text: str) -> float:
    """A sampling period: refused here, before any child starts, when it would spin."""
    value = number(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text!r} is below the {MIN_INTERVAL_S} s minimum sampling period")
    return value


def bounded(low: float, high: float) -> Callable[[str], float]:
    """A parser for a finite number in (low, high]."""
    def parse(text: str) -> float:
        value = number(text)
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be > {low:g} and <= {high:g}")
        return value

    return parse


def count(text: str) -> int:
    """An integer >= 1 (GPUs, steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def add_common(p: argparse.ArgumentParser, out: bool = True) -> None:
    """``--out`` (unless ``out=False``), ``--price-per-gpu-hour``, ``--gpus``, ``--json``, ``--debug``."""
    if out:
        p.add_argument("--out", type=Path, default=None, help="run folder (default reports/<mode>-<timestamp>/)")
    p.add_argument("--price-per-gpu-hour", type=non_negative, default=None, metavar="USD",
                   help="price of one GPU-hour (else GPUDOCTOR_PRICE_PER_GPU_HOUR, else a table by GPU name)")
    p.add_argument("--gpus", type=count, default=None, metavar="N", help="GPUs you pay for (default: those seen)")
    p.add_argument("--json", action="store_true",
                   help="print the JSON report alone on stdout (a command's own stdout then goes to stderr), "
                        "so a program can parse it: gpudoctor run --json -- python train.py | jq .findings")
    add_debug(p)


def add_debug(p: argparse.ArgumentParser) -> None:
    """``--debug``: the one common option of the commands that read a report rather than write one."""
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet``: the commands that show a live panel or progress bar on a terminal."""
    p.add_argument("--quiet", action="store_true",
                   help="no live panel or progress bar on the terminal (none is shown either without a terminal, "
                        "with --json or with CI set); the summary at the end is printed as usual")


def add_no_trackers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-trackers", action="store_true",
                   help="do not add the report's figures to the MLflow / W&B / TensorBoard runs the training "
                   "logs to (docs/trackers.md)")


def add_command(p: argparse.ArgumentParser) -> None:
    """The command to run, for ``run`` and ``try``: :func:`gpudoctor.cli.parse` gives it what follows ``--``."""
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command to profile, after -- (everything after -- is the command's)")


def add_history(p: argparse.ArgumentParser, writes: bool = True) -> None:
    """``--history PATH``; for the commands that write a report, also ``--no-history`` and ``--name``."""
    p.add_argument("--history", type=Path, default=None, metavar="PATH",
                   help="the run history database (else GPUDOCTOR_HISTORY, else "
                   "$XDG_DATA_HOME/gpudoctor/history.sqlite3; docs/history.md)")
    if writes:
        p.add_argument("--no-history", action="store_true",
                       help="do not add this report to the run history (GPUDOCTOR_HISTORY=off does the same)")
        p.add_argument("--name", default=None, metavar="NAME",
                       help="name this run in the history, for 'gpudoctor check --baseline NAME'")


def history_location(args: argparse.Namespace) -> Path | None:
    """The history database the command's flags and GPUDOCTOR_HISTORY name; None: skipped. A
    namespace built without the history flags (a command called from code) has the defaults."""
    from gpudoctor.history.store import location

    return location(getattr(args, "history", None), getattr(args, "no_history", False))


def record_history(args: argparse.Namespace, report: Report, folder: Path, *, git: bool = True) -> int | None:
    """Add a written report to the history (:func:`gpudoctor.history.index.record`): never raises."""
    from gpudoctor.history.index import record

    return record(report, folder, history_location(args), name=getattr(args, "name", None), git=git,
                  quiet=bool(getattr(args, "json", False)))
