"""``gpudoctor sweep CONFIG.yaml --grid KEY=V1,V2 ...``: measure a grid of settings.

Each point is one replay trial in its own process (see :mod:`gpudoctor.sweep`);
the folder gets ``sweep.json``, ``sweep.md``, ``sweep.html`` and ``best.yaml``.
Exit 0 when at least one point trained steadily, 1 when none did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpudoctor.commands import flags
from gpudoctor.common.termtext import say
from gpudoctor.sweep.options import (
    DEFAULT_MAX_TRIALS,
    DEFAULT_NOISE,
    DEFAULT_REPEATS,
    DEFAULT_TRIAL_TIMEOUT_S,
    SweepOptions,
)

HELP = "measure a grid of worker/batch settings"
DESCRIPTION = (
    "One replay trial per grid point, each in its own process; steady-state samples/s, tokens/s, "
    "step time, data wait, memory and cost per point; the fastest point and the config change that "
    "reaches it. Results are cached by the hash of each point's effective config."
)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, nargs="?", help="replay config YAML (see sample_configs/README.md)")
    flags.add_common(p)
    flags.add_quiet(p)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="an axis: any config key, dotted (training.dataloader_num_workers) or a bare "
                   "TrainingArguments name (dataloader_num_workers); repeat for more axes")
    p.add_argument("--hold-global-batch", action="store_true",
                   help="vary micro-batch x accumulation at the current effective batch only")
    _add_search(p)
    _add_backend(p)
    p.add_argument("--target", default=None, help="price points on this GPU through preflight (e.g. h100)")
    p.add_argument("--cache", type=Path, default=None,
                   help="trial cache (default $GPUDOCTOR_SWEEP_CACHE or ~/.cache/gpudoctor/sweep)")
    p.add_argument("--max-trials", type=_int, default=DEFAULT_MAX_TRIALS,
                   help=f"refuse to start more new trials than this without --yes (default {DEFAULT_MAX_TRIALS})")
    p.add_argument("--yes", action="store_true", help="run a grid larger than --max-trials")
    _add_measurement(p)


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adaptive", action="store_true",
                   help="search the grid on an Optuna study instead of measuring every point (resumable); "
                   "points clearly slower than the best in their first windows are pruned")
    p.add_argument("--search", choices=("climb", "tpe"), default="climb",
                   help="--adaptive's strategy on the Optuna study: climb (one axis at a time, default: "
                   "fewer trials on worker x batch grids, see docs/sweep.md) or tpe (Optuna's TPE sampler)")
    p.add_argument("--study-storage", default=None, metavar="URL",
                   help="--adaptive's Optuna storage: any Optuna URL (e.g. postgresql://..., for several "
                   "drivers on one study); default a SQLite file in the trial cache, so a rerun resumes")


def _add_backend(p: argparse.ArgumentParser) -> None:
    """Where trials run: here, on Ray, or as a Slurm array whose shards are merged after."""
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where trials run: local (one process at a time, default) or ray (Ray tasks, many "
                   "at once; pip install 'gpudoctor[ray]')")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --backend ray: join this cluster (auto or HOST:PORT); default a local Ray "
                   "instance for this sweep")
    p.add_argument("--emit-slurm", type=Path, default=None, metavar="DIR",
                   help="write a Slurm job array (one task per point, --shard under the hood) and its "
                   "merge step to DIR instead of running trials")
    p.add_argument("--shard", default=None, metavar="I/N", help="run only slice I (0-based) of N; join with --merge")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                   help="join the --out folders of finished shards into --out")


def _add_measurement(p: argparse.ArgumentParser) -> None:
    """How one trial is measured: its time limit, its windows, and when a noisy point is repeated."""
    p.add_argument("--trial-timeout", type=_float, default=DEFAULT_TRIAL_TIMEOUT_S, metavar="S",
                   help=f"stop a trial that runs longer (a hang) (default {DEFAULT_TRIAL_TIMEOUT_S:g})")
    p.add_argument("--warmup-s", type=_float, default=2.0, metavar="S",
                   help="seconds after the first batch left out of the measurement (default 2)")
    p.add_argument("--window-s", type=_float, default=2.0, metavar="S", help="length of one window (default 2)")
    p.add_argument("--windows", type=_int, default=3, help="measurement windows per trial (default 3)")
    p.add_argument("--noise", type=_float, default=DEFAULT_NOISE, metavar="F",
                   help=f"repeat a point whose windows spread more than F (default {DEFAULT_NOISE:g})")
    p.add_argument("--repeats", type=_int, default=DEFAULT_REPEATS,
                   help=f"extra runs at most for a noisy point (default {DEFAULT_REPEATS})")
    p.add_argument("--torch-threads", type=_int, default=None, metavar="N",
                   help="intra-op threads per trial (default: 1 without a GPU, PyTorch's own with one; 0: PyTorch's)")


def main(args: argparse.Namespace) -> int:
    from gpudoctor.common.redact import redact_argv
    from gpudoctor.render.sweep_page import adaptive_text, headline
    from gpudoctor.sweep.session import merge_sweeps, run_sweep

    opts = SweepOptions.from_args(args)
    argv = ["gpudoctor", "sweep", *sys.argv[2:]] if sys.argv[1:2] == ["sweep"] else []
    opts.argv = redact_argv(argv)  # a --study-storage URL may hold a database password
    if opts.emit_slurm is not None:
        return _emit(opts)
    doc, folder = merge_sweeps(opts) if opts.merge else run_sweep(opts)
    if opts.as_json:
        say(json.dumps(doc, indent=2, default=str), file=sys.stdout)
    out = sys.stderr
    say(f"\ngpudoctor: {headline(doc)}", file=out)
    change = doc.get("change") or {}
    if change.get("yaml_diff"):
        say(
            "  change:\n" + "\n".join("    " + line for line in change["yaml_diff"].splitlines()),
            file=out,
        )
    if change.get("lr_advice"):
        say(f"  {change['lr_advice']['text']}", file=out)
    if change.get("same_batch"):
        say(f"  or keep the batch: {change['same_batch']['text']}", file=out)
    if change.get("command"):
        say(f"  check it: {change['command']}", file=out)
    for note in doc.get("notes") or []:
        say(f"  note: {note}", file=out)
    adaptive = doc.get("adaptive")
    if adaptive:
        say(f"  {adaptive_text(adaptive)}", file=out)
    say(f"  report: {folder / 'sweep.html'}", file=out)
    return 0 if doc.get("best") else 1


def _emit(opts: SweepOptions) -> int:
    from gpudoctor.sweep.session import emit_slurm

    paths, count = emit_slurm(opts)
    folder = paths[0].parent
    say(
        f"gpudoctor: wrote a Slurm job array of {count} tasks (one per point) and its merge step:\n"
        + "\n".join(f"  {p}" for p in paths)
        + f"\n  submit: {folder / 'submit.sh'}  (result: {folder / 'merged' / 'sweep.html'})",
        file=sys.stderr,
    )
    return 0
