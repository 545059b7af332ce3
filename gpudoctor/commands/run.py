"""``gpudoctor run -- CMD``: profile a command from launch to exit, no code changes.

The work is :func:`gpudoctor.launch.launcher.run`'s, shared with ``try`` and ``replay``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.commands import flags

if TYPE_CHECKING:
    from gpudoctor.launch.launcher import View

HELP = "profile a training command until it exits"
DESCRIPTION = ("Profile CMD (e.g. python train.py) with no code changes, until it exits; exit with CMD's exit "
               "code. The doctor's options go before --, the command after it: gpudoctor run --out DIR -- "
               "python train.py --lr 3e-4.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_common(p)
    p.add_argument("--interval", type=flags.interval, default=0.1, help="sampling period in seconds (default 0.1)")
    flags.add_quiet(p)
    flags.add_no_trackers(p)
    p.add_argument("--no-timing", action="store_true",
                   help="do not time the model at other row widths or its compute back to back after the training "
                        "exits (up to a minute more; GPU time on a GPU); the predictions that would use them say so")
    flags.add_history(p)
    flags.add_command(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.launch.launcher import NO_TIMING, RunSpec, run
    from gpudoctor.render.progress import live_output

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    ran = run(RunSpec(command, args.out, args.interval, args.price_per_gpu_hour, args.gpus, as_json=args.json,
                      trackers=not args.no_trackers, untimed=NO_TIMING if args.no_timing else None,
                      view=_panel() if live_output(sys.stderr, quiet=args.quiet, as_json=args.json) else None))
    if ran.report is not None:
        flags.record_history(args, ran.report, ran.folder)
    return ran.code


def _panel() -> Callable[[Path], View]:
    """The live panel (gpudoctor/live/view.py), made once the run folder exists."""
    from gpudoctor.live.view import LiveView

    return lambda folder: LiveView(folder, "gpudoctor run", sys.stderr)
