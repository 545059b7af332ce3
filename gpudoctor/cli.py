"""Command line: ``gpudoctor run|try|attach|replay|sweep|report|diff|check|export``.

argparse (stdlib) keeps ``gpudoctor --help`` fast; each command imports what it
needs only when it runs. Errors are one line: ``gpudoctor: <problem>; <fix>``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gpudoctor._version import __version__
from gpudoctor.common.errors import UserError
from gpudoctor.sweep.cli_args import DESCRIPTION as SWEEP_DESCRIPTION
from gpudoctor.sweep.cli_args import add_arguments as add_sweep_arguments


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message}; see '{self.prog} --help'")


MIN_INTERVAL_S = 0.01  # 100 Hz: below it the samplers would spin a core, not measure better
PID_MAX = 2**22  # the kernel's highest pid_max


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _non_negative(text: str) -> float:
    """A finite number >= 0 (a price: 0 is a free GPU)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _positive(text: str) -> float:
    """A finite number > 0 (seconds, rates: 0 would mean never, or divide by zero)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _interval(text: str) -> float:
    """A sampling period: refused here, before any child starts, when it would spin."""
    value = _number(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"{text!r} is below the {MIN_INTERVAL_S} s minimum sampling period")
    return value


def _bounded(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text)
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be > {low:g} and <= {high:g}")
        return value

    return parse


def _count(text: str) -> int:
    """An integer >= 1 (GPUs, steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= PID_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a whole number from 1 to {PID_MAX})")
    return value


def _waste(text: str) -> float:
    """``--max-waste``: ``0.2`` or ``20%``; a bare number above 1 is refused, never read as a percentage."""
    percent = text.strip().endswith("%")
    value = _number(text.strip().removesuffix("%")) / (100 if percent else 1)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    if value > 1:
        hint = "at most 100%" if percent else f"write {text.strip()}% for a percentage, or a fraction such as 0.2"
        raise argparse.ArgumentTypeError(f"{text!r} is above 1 (all of the wall time); {hint}")
    return value


def _common(p: argparse.ArgumentParser, out: bool = True) -> None:
    if out:
        p.add_argument("--out", type=Path, default=None, help="run folder (default reports/<mode>-<timestamp>/)")
    p.add_argument("--price-per-gpu-hour", type=_non_negative, default=None, metavar="USD",
                   help="price of one GPU-hour (else GPUDOCTOR_PRICE_PER_GPU_HOUR, else a table by GPU name)")
    p.add_argument("--gpus", type=_count, default=None, metavar="N", help="GPUs you pay for (default: those seen)")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def _no_trackers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-trackers", action="store_true",
                   help="do not add the report's figures to the MLflow / W&B / TensorBoard runs the training "
                   "logs to (docs/trackers.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpudoctor", description="Where did the GPU-hours go, and what to change.")
    parser.add_argument("--version", action="version", version=f"gpudoctor {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("run", help="profile a training command until it exits",
                       description="Profile CMD (e.g. python train.py) with no code changes, until it "
                       "exits; exit with CMD's exit code. The doctor's options go before --, the command "
                       "after it: gpudoctor run --out DIR -- python train.py --lr 3e-4.")
    _common(p)
    p.add_argument("--interval", type=_interval, default=0.1, help="sampling period in seconds (default 0.1)")
    _no_trackers(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command to profile, after -- (everything after -- is the command's)")

    p = sub.add_parser("try", help="measure a finding's fix on the command itself, before editing code",
                       description="Profile CMD for S seconds of training (the baseline), then run CMD again "
                       "for S seconds of training with the top finding's fix (or --fix RULE) applied by the "
                       "hooks: TrainingArguments fields, DataLoader workers/pin memory/prefetch, tokenizer "
                       "max_length/padding, save interval. A fix that needs a code change is said, not tried. "
                       "The report compares predicted and achieved steady-state steps/s. Both runs are your "
                       "command itself, with its side effects (it may write outputs and checkpoints).")
    _common(p)
    p.add_argument("--fix", default=None, metavar="RULE", help="the finding whose fix to try (default: the top "
                   "finding the hooks can apply)")
    p.add_argument("--seconds", type=_positive, default=60.0, metavar="S",
                   help="seconds of training per run, counted from the first step (default 60)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="try this value instead of (or besides) the fix's own, e.g. --set num_workers=2")
    p.add_argument("--interval", type=_interval, default=0.1, help="sampling period in seconds (default 0.1)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command to profile, after -- (everything after -- is the command's)")

    p = sub.add_parser("attach", help="profile a running training process",
                       description="Profile a running training process (its ranks and DataLoader workers) "
                       "until it exits, --duration passes, or Ctrl-C; then write the report.")
    p.add_argument("pid", type=_pid, help="the training process, its launcher (torchrun) or a wrapper around it")
    _common(p)
    p.add_argument("--duration", type=_positive, default=None, metavar="S",
                   help="detach after S seconds (default: when the process exits or on Ctrl-C)")
    p.add_argument("--interval", type=_interval, default=0.5,
                   help="host/GPU sampling period in seconds (default 0.5: the patient's CPU is not ours)")
    p.add_argument("--sample-rate", type=_bounded(0, 1000), default=20.0, metavar="HZ",
                   help="py-spy stack samples per second (default 20)")
    p.add_argument("--no-inject", action="store_true",
                   help="do not load the in-process hooks (no debugger); estimate from stack samples only")
    _no_trackers(p)

    p = sub.add_parser("replay", help="run a training config for a bounded time and diagnose it",
                       description="Rebuild a training config's pipeline (dataset, tokenizer, collator, "
                       "DataLoader, model) here, run it for a bounded time under the doctor, and predict "
                       "the full run on --target, a GPU you have not rented (docs/replay.md). The config "
                       "can be derived from a recorded run folder or a Trainer checkpoint's JSON files; it "
                       "is then written as replay.yaml in --out, each value with its source.")
    p.add_argument("config", type=Path, nargs="?", metavar="CONFIG|RUN",
                   help="replay config YAML (see sample_configs/README.md), or a run folder recorded by "
                   "gpudoctor run to derive one from")
    p.add_argument("--training-args", type=Path, default=None, metavar="JSON",
                   help="TrainingArguments.to_json_string() output (not training_args.bin: a pickle is never loaded)")
    p.add_argument("--model-config", type=Path, default=None, metavar="JSON",
                   help="the model's config.json: its architecture and size")
    _common(p)
    p.add_argument("--target", default=None, help="predict the full run on this GPU (e.g. h100)")
    p.add_argument("--max-steps", type=_count, default=None, metavar="N",
                   help="stop after N optimizer steps or --max-seconds, whichever comes first "
                   "(default: the config's replay.steps, 20)")
    p.add_argument("--max-seconds", type=_positive, default=None, metavar="S",
                   help="stop after S seconds of training (default: the config's replay.seconds, 30)")
    p.add_argument("--mfu", type=_bounded(0, 1), default=None,
                   help="assumed model FLOPs utilization for predictions (default hardware.mfu, 0.4)")

    p = sub.add_parser("sweep", help="measure a grid of worker/batch settings", description=SWEEP_DESCRIPTION)
    p.add_argument("config", type=Path, nargs="?", help="replay config YAML (see sample_configs/README.md)")
    _common(p)
    add_sweep_arguments(p)

    p = sub.add_parser("report", help="render a saved run (.html, .md or .json by OUT's extension)",
                       description="Re-render a saved run: a run folder is analysed again from its "
                       "recording (with this gpudoctor's rules); a report.json is rendered as it is. "
                       "The format follows -o's extension.")
    p.add_argument("input", type=Path, nargs="+",
                   help="run folder or report.json; several run folders (one per node of one job) merge into "
                   "one report, with -o")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                   help="file to write, .html, .md or .json (default: report.html, .md and .json beside IN)")
    _common(p, out=False)

    p = sub.add_parser("diff", help="compare two runs (before/after)",
                       description="Compare two runs for a pull request: breakdown, step time, waste and "
                       "dollars side by side, and which findings were resolved, remain or are new.")
    p.add_argument("before", type=Path, help="the earlier run: run folder or report.json")
    p.add_argument("after", type=Path, help="the later run: run folder or report.json")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                   help="file to write, .md, .html or .json (default: Markdown on stdout)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")

    p = sub.add_parser("check", help="exit 1 when more than a given share of wall time is wasted (a CI gate)",
                       description="A CI gate: exit 1 when the report's wasted share of wall time is above "
                       "--max-waste, 0 when it is at or below it, 2 when the report measured nothing inside "
                       "the training.")
    p.add_argument("input", type=Path, help="run folder or report.json")
    p.add_argument("--max-waste", type=_waste, required=True, metavar="FRACTION",
                   help="the most wasted wall time allowed, as a fraction of wall time (0.2) or a "
                   "percentage with %% (20%%); a bare number above 1 is refused")
    p.add_argument("--allow-crash", action="store_true",
                   help="gate a crashed run on what ran before the crash (default: a crash fails)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")

    p = sub.add_parser("export", help="write a run's tables (samples, events, steps, breakdown) as parquet or CSV",
                       description="Write the tables gpudoctor.load(PATH) gives a notebook into DIR, one file "
                       "per table, each row tagged with the run's name, so many runs can be queried together "
                       "(docs/notebooks.md). Needs pandas (and pyarrow for parquet): pip install "
                       "'gpudoctor[pandas]'.")
    p.add_argument("input", type=Path, help="run folder or report.json (a report.json alone gives empty tables)")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="file format (default parquet)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                   help="folder for <table>.<format> (created if missing; one folder per run)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GPUDOCTOR_DEBUG") == "1"
    try:
        args = parse(argv)
        if args.cmd is None:
            build_parser().print_help()
            return 2
        return _dispatch(args)
    except UserError as exc:
        if debug:
            raise
        print(f"gpudoctor: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gpudoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


WRAPPING = ("run", "try")  # the subcommands that run a command given after --


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; for ``run``/``try``, the command is exactly what follows ``--``.

    Splitting at ``--`` here (not inside argparse) reads the same on every Python version and
    leaves nothing to guess: the doctor's options go before ``--``, the command after it. A
    command without ``--`` is refused with the corrected line, so ``gpudoctor run python -c ...
    --out foo`` never hands the doctor's ``--out`` to the script, nor the script's to the doctor.
    """
    parser = build_parser()
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


def _dispatch(args: argparse.Namespace) -> int:
    import importlib

    module = {"run": "run", "try": "try_cmd", "attach": "attach", "replay": "replay", "sweep": "sweep",
              "report": "render_cmd", "diff": "diff_cmd", "check": "check", "export": "export_cmd"}[args.cmd]
    return importlib.import_module(f"gpudoctor.commands.{module}").main(args)
