"""``gpudoctor report IN [-o OUT]``: re-render a saved run."""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.commands.load import load_report, malformed_report_guard
from gpudoctor.errors import UserError


def main(args: Any) -> int:
    report = load_report(args.input, args.price_per_gpu_hour, args.gpus)
    with malformed_report_guard(args.input):
        _write(report, args)
    if args.json:
        import json

        print(json.dumps(report, indent=2))
    return 0


def _write(report: dict[str, Any], args: Any) -> None:
    from gpudoctor.render import renderer_for, write_all
    from gpudoctor.render.output import write_output

    if args.output is None:
        folder = args.input if args.input.is_dir() else args.input.parent
        try:
            paths = write_all(report, folder)
        except OSError as exc:
            raise UserError(f"cannot write the report into {folder}: {exc.strerror or exc}; pass -o OUT") from None
        print("\n".join(str(p) for p in paths), file=sys.stderr)
    else:
        write_output(args.output, renderer_for(args.output).render(report))
        print(str(args.output), file=sys.stderr)
