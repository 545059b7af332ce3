"""``gpudoctor history [SCRIPT]``: the runs gpudoctor has reported, newest first (docs/history.md)."""

from __future__ import annotations

import argparse
import json
import sys

from gpudoctor.commands import flags
from gpudoctor.common.termtext import say

HELP = "list the runs gpudoctor reported (steps/s, waste, top finding), newest first"
DESCRIPTION = ("List the runs whose reports gpudoctor wrote (run, attach, try, replay, report), newest first: "
               "id, time, name, script, git commit, GPU, steps/s, wasted share, top finding and folder. "
               "An id or --name is what 'gpudoctor check --baseline' and 'gpudoctor diff' take.")

DEFAULT_LIMIT = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("script", nargs="?", default=None,
                   help="only this script's runs: a path, or a file name (train.py) for any folder's")
    p.add_argument("--limit", type=flags.count, default=DEFAULT_LIMIT, metavar="N",
                   help=f"the newest N runs (default {DEFAULT_LIMIT})")
    p.add_argument("--all", action="store_true", help="every run, not only the newest --limit")
    p.add_argument("--json", action="store_true", help="a JSON list of the runs on stdout, every column")
    flags.add_history(p, writes=False)
    flags.add_debug(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.common.errors import UserError
    from gpudoctor.history.store import History, NoHistory
    from gpudoctor.render.history_table import table_lines

    where = flags.history_location(args)
    if where is None:
        raise UserError("the history is turned off (GPUDOCTOR_HISTORY=off); pass --history PATH to read one")
    try:
        with History(where, create=False) as history:
            entries = history.entries(args.script, None if args.all else args.limit)
    except NoHistory as exc:
        if args.json:
            say("[]", file=sys.stdout)
        say(f"gpudoctor: {exc}", file=sys.stderr)
        return 0
    if args.json:
        say(json.dumps([e.to_json() for e in entries], indent=2), file=sys.stdout)
        return 0
    if not entries:
        which = f" of {args.script}" if args.script else ""
        say(f"gpudoctor: no runs{which} in the history {where}", file=sys.stderr)
        return 0
    say("\n".join(table_lines(entries)), file=sys.stdout)
    return 0
