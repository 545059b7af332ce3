"""Command line: ``gpudoctor run|try|attach|replay|sweep|report|diff|check|history|export``.

Each command is a module of :mod:`gpudoctor.commands` that owns its flags (``add_arguments``)
beside its work (``main``); :data:`COMMANDS` lists them, in the order ``--help`` shows. Building
the parser imports every command module, so each keeps its load light (stdlib, its flags) and
imports what its work needs inside ``main``: ``gpudoctor --help`` stays fast and loads no torch,
pandas or matplotlib (tests/test_cli.py checks). Errors are one line: ``gpudoctor: <problem>; <fix>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from types import TracebackType
from typing import Protocol

from gpudoctor._version import __version__
from gpudoctor.commands import (
    attach,
    check,
    diff,
    export,
    history,
    replay,
    report,
    run,
    sweep,
    try_,
)
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say


class Command(Protocol):
    """What :mod:`gpudoctor.cli` needs of a command module."""

    HELP: str  # one line, in ``gpudoctor --help``
    DESCRIPTION: str  # the command's own ``--help``

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


COMMANDS: dict[str, Command] = {
    "run": run, "try": try_, "attach": attach, "replay": replay, "sweep": sweep,
    "report": report, "diff": diff, "check": check, "history": history, "export": export,
}
WRAPPING = ("run", "try")  # the commands that run a command given after --


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message}; see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpudoctor", description="Where did the GPU-hours go, and what to change.")
    parser.add_argument("--version", action="version", version=f"gpudoctor {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION))
    return parser


def main(argv: list[str] | None = None) -> int:
    sys.excepthook = excepthook
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GPUDOCTOR_DEBUG") == "1"
    try:
        args = parse(argv)
        if args.cmd is None:
            build_parser().print_help()
            return 2
        return COMMANDS[args.cmd].main(args)
    except UserError as exc:
        if debug:
            raise
        say(f"gpudoctor: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        say("gpudoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """An exception nothing caught (a bug, ``--debug``): its traceback, through the one sanitiser,
    as its message may quote the patient's strings (a path, a flag)."""
    say("".join(traceback.format_exception(kind, exc, tb)).rstrip(), file=sys.stderr)


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; for ``run``/``try``, the command is exactly what follows ``--``.

    Splitting at ``--`` here (not inside argparse) reads the same on every Python version and
    leaves nothing to guess: the doctor's options go before ``--``, the command after it. A
    command without ``--`` is refused with the corrected line, so ``gpudoctor run python -c ...
    --out foo`` never hands the doctor's ``--out`` to the script, nor the script's to the doctor.
    """
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        raise UserError(_not_a_command(argv))
    if not argv or argv[0] not in WRAPPING:
        return parser.parse_args(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    head, tail = argv[:split], argv[split + 1:]
    args = parser.parse_args(head)
    caught = list(args.command)  # words before -- (or with no -- at all) that argparse took as a command
    if caught:
        after = ["--", *tail] if split < len(argv) else []
        raise UserError(_needs_dashes(parser, head[: len(head) - len(caught)], caught, after))
    args.command = tail
    return args


def _not_a_command(argv: list[str]) -> str:
    """``gpudoctor python train.py``: the user meant to profile it; say the line that does."""
    import shlex

    return (f"{argv[0]!r} is not a gpudoctor command ({', '.join(COMMANDS)}); to profile it: "
            f"gpudoctor run -- {shlex.join(argv)} (see 'gpudoctor --help')")


def _needs_dashes(parser: argparse.ArgumentParser, head: list[str], caught: list[str], after: list[str]) -> str:
    """One line saying the command needs ``--`` before it, with the corrected command line.

    The doctor's own options found among the command's words are moved before ``--`` in the
    suggestion; the line says so, since the script may have an option of the same name.
    """
    import shlex

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[head[0]]
    given = {w.split("=", 1)[0] for w in head}  # an option the doctor already has is the command's
    takes_value = {s: a.nargs != 0 for a in sub._actions for s in a.option_strings
                   if s not in ("-h", "--help") and s not in given}
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(caught):
        name = caught[i].split("=", 1)[0]
        width = 1
        if name in takes_value and takes_value[name] and "=" not in caught[i] and i + 1 < len(caught):
            width = 2
        (moved if name in takes_value else rest).extend(caught[i:i + width])
        i += width
    fixed = shlex.join(["gpudoctor", *head, *moved, "--", *rest, *after])
    if not moved:
        return f"put -- before the command, so none of its words is read as the doctor's: {fixed}"
    names = "/".join(dict.fromkeys(w.split("=", 1)[0] for w in moved if w.startswith("-")))
    return (f"{names} after the command would go to the command, not to the doctor; the doctor's options go "
            f"before --, the command after it: {fixed} (if {names} is the command's own, keep it after --)")
