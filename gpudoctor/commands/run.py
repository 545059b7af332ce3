"""``gpudoctor run -- CMD``: profile a command from launch to exit, no code changes.

The work is :func:`gpudoctor.launch.launcher.run`'s, shared with ``try`` and ``replay``.
"""

from __future__ import annotations

import argparse

from gpudoctor.commands import flags

HELP = "profile a training command until it exits"
DESCRIPTION = ("Profile CMD (e.g. python train.py) with no code changes, until it exits; exit with CMD's exit "
               "code. The doctor's options go before --, the command after it: gpudoctor run --out DIR -- "
               "python train.py --lr 3e-4.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_common(p)
    p.add_argument("--interval", type=flags.interval, default=0.1, help="sampling period in seconds (default 0.1)")
    flags.add_no_trackers(p)
    flags.add_history(p)
    flags.add_command(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.launch.launcher import run

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    code, report, folder = run(command, args.out, args.interval, args.price_per_gpu_hour, args.gpus, args.json,
                               trackers=not args.no_trackers)
    if report is not None:
        flags.record_history(args, report, folder)
    return code
