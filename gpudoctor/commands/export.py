"""``gpudoctor export PATH --format parquet|csv -o DIR``: a run's tables as files (see docs/notebooks.md)."""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.common.termtext import terminal_safe
from gpudoctor.report.export import write_tables
from gpudoctor.tables import load


def main(args: Any) -> int:
    run = load(args.input)
    for path in write_tables(run, args.output, args.format):
        print(str(path), file=sys.stderr)
    for note in run.notes:
        print(f"gpudoctor: note: {terminal_safe(note, limit=400)}", file=sys.stderr)
    return 0
