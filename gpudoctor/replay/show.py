"""``python -m gpudoctor.replay.show CONFIG MEASURE.json [--target GPU] [--mfu X] [--json]``

Print a preflight prediction as a before/after Markdown table, for a person
reading it in a terminal or pasting it into a pull request: the quick look, with the
report's own display code (:mod:`gpudoctor.render.preflight`).
"""

from __future__ import annotations

import argparse
import json
import sys

from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.render.preflight import markdown
from gpudoctor.replay.config import load_config
from gpudoctor.replay.preflight import predict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpudoctor.replay.show", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("config")
    parser.add_argument("measure", help="replay_measure.json written by the worker")
    parser.add_argument("--target", default=None)
    parser.add_argument("--mfu", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    args = parser.parse_args(argv)
    try:
        with open(args.measure, encoding="utf-8") as fh:
            measure = json.load(fh)
        prediction = predict(load_config(args.config), measure, target=args.target, mfu=args.mfu)
    except UserError as exc:
        say(f"gpudoctor: {exc}", file=sys.stderr)
        return exc.exit_code
    except (OSError, json.JSONDecodeError) as exc:
        say(f"gpudoctor: cannot read {args.measure}: {exc.__class__.__name__}", file=sys.stderr)
        return 2
    say(json.dumps(prediction, indent=1) if args.json else markdown(prediction), file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
