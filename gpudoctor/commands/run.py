"""``gpudoctor run -- CMD``: profile a command from launch to exit, no code changes.

The work is :func:`gpudoctor.launch.launcher.run`'s, shared with ``try`` and ``replay``.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.launch.launcher import run


def main(args: Any) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    code, _, folder = run(command, args.out, args.interval, args.price_per_gpu_hour, args.gpus, args.json,
                          trackers=not args.no_trackers)
    return code
