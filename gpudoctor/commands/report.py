"""``gpudoctor report IN... [-o OUT]``: re-render a saved run, or merge a multi-node job's run folders."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.commands import flags
from gpudoctor.common.errors import UserError
from gpudoctor.common.safefs import pinned_folder
from gpudoctor.common.termtext import say

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report

HELP = "render a saved run (.html, .md or .json by OUT's extension)"
DESCRIPTION = ("Re-render a saved run: a run folder is analysed again from its recording (with this gpudoctor's "
               "rules); a report.json is rendered as it is. The format follows -o's extension. Written beside "
               "the run (no -o), the report is indexed in the run history again (its entry updated).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, nargs="+",
                   help="run folder or report.json; several run folders (one per node of one job) merge into "
                   "one report, with -o")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                   help="file to write, .html, .md or .json (default: report.html, .md and .json beside IN)")
    flags.add_common(p, out=False)
    flags.add_history(p)


def main(args: argparse.Namespace) -> int:
    from gpudoctor.commands.load import load_job, load_report, malformed_report_guard
    from gpudoctor.render.nodes import terminal_lines

    inputs: list[Path] = args.input if isinstance(args.input, list) else [args.input]
    if len(inputs) > 1 and args.output is None:
        raise UserError("merging several nodes' run folders needs -o OUT (.html, .md or .json) for the "
                        "job's report, e.g. -o merged.html")
    with ExitStack() as stack:
        # Each folder opened once (O_NOFOLLOW): read and written through that descriptor, so one
        # renamed and replaced by a link meanwhile redirects nothing (SECURITY.md).
        pinned = [stack.enter_context(pinned_folder(p)) for p in inputs]
        if len(inputs) > 1:
            report = load_job(pinned, args.price_per_gpu_hour, args.gpus)
        else:
            report = load_report(pinned[0], args.price_per_gpu_hour, args.gpus)
        with malformed_report_guard(*inputs):
            _write(report, inputs[0], pinned[0], args.output)
        folder = inputs[0] if pinned[0].is_dir() else inputs[0].parent
    if len(inputs) == 1 and args.output is None:  # written beside the run: indexed as that run, again
        flags.record_history(args, report, folder, git=False)
    if len(inputs) > 1:
        say("\n".join(terminal_lines(report)), file=sys.stderr)
    if args.json:
        say(json.dumps(report, indent=2), file=sys.stdout)
    return 0


def _write(report: Report, source: Path, pinned: Path, output: Path | None) -> None:
    from gpudoctor.render import renderer_for, write_all
    from gpudoctor.render.output import write_output

    if output is None:
        shown = source if pinned.is_dir() else source.parent
        try:
            with pinned_folder(pinned if pinned.is_dir() else source.parent) as folder:
                names = [p.name for p in write_all(report, folder)]
        except OSError as exc:
            raise UserError(f"cannot write the report into {shown}: {exc.strerror or exc}; pass -o OUT") from None
        say("\n".join(str(shown / name) for name in names), file=sys.stderr)
    else:
        write_output(output, renderer_for(output).render(report))
        say(str(output), file=sys.stderr)
