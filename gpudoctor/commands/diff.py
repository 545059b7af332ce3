"""``gpudoctor diff BEFORE AFTER [-o OUT]``: before/after for a pull request.

Each side is a run folder, a report.json, or a run from the history (its id or ``--name``;
:func:`gpudoctor.commands.load.report_source`): a path that exists wins over an id.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpudoctor.commands import flags
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say

HELP = "compare two runs (before/after)"
DESCRIPTION = ("Compare two runs for a pull request: breakdown, step time, waste and dollars side by side, and "
               "which findings were resolved, remain or are new.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("before", help="the earlier run: run folder or report.json, or a history id or --name")
    p.add_argument("after", help="the later run: run folder or report.json, or a history id or --name")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                   help="file to write, .md, .html or .json (default: Markdown on stdout)")
    flags.add_history(p, writes=False)
    flags.add_debug(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.commands.load import load_report, malformed_report_guard, report_source
    from gpudoctor.render.diff_page import render_diff_html, render_diff_markdown
    from gpudoctor.render.diff_words import diff_json
    from gpudoctor.render.output import write_output
    from gpudoctor.report.diff import diff_reports

    where = flags.history_location(args)
    sources = report_source(args.before, where), report_source(args.after, where)
    before, after = load_report(sources[0]), load_report(sources[1])
    out = args.output
    suffix = out.suffix.lower() if out is not None else ".md"
    if suffix not in (".md", ".html", ".htm", ".json"):
        raise UserError(f"cannot write a diff to {out}: use an output ending in .md, .html or .json")
    with malformed_report_guard(*sources):
        d = diff_reports(before, after)
        if suffix == ".md":
            text = render_diff_markdown(d)
        elif suffix in (".html", ".htm"):
            text = render_diff_html(d)
        else:
            text = diff_json(d)
    if out is None:
        say(text, file=sys.stdout)
    else:
        write_output(out, text)
    return 0
