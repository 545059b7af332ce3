"""``gpudoctor export PATH --format parquet|csv -o DIR``: a run's tables as files (see docs/notebooks.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpudoctor.commands import flags
from gpudoctor.common.termtext import say, terminal_safe

HELP = "write a run's tables (samples, events, steps, breakdown) as parquet or CSV"
DESCRIPTION = ("Write the tables gpudoctor.load(PATH) gives a notebook into DIR, one file per table, each row "
               "tagged with the run's name, so many runs can be queried together (docs/notebooks.md). Needs "
               "pandas (and pyarrow for parquet): pip install 'gpudoctor[pandas]'.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="run folder or report.json (a report.json alone gives empty tables)")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="file format (default parquet)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                   help="folder for <table>.<format> (created if missing; one folder per run)")
    flags.add_debug(p)


def main(args: argparse.Namespace) -> int:
    # pandas loads only when a run is exported
    from gpudoctor.tables import load
    from gpudoctor.tables.export import write_tables

    run = load(args.input)
    for path in write_tables(run, args.output, args.format):
        say(str(path), file=sys.stderr)
    for note in run.notes:
        say(f"gpudoctor: note: {terminal_safe(note, limit=400)}", file=sys.stderr)
    return 0
