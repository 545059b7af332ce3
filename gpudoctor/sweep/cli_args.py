"""The ``gpudoctor sweep`` flags (kept here so ``cli.py`` holds one line for them).

Stdlib-only imports: ``gpudoctor --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpudoctor.sweep.options import (
    DEFAULT_MAX_TRIALS,
    DEFAULT_NOISE,
    DEFAULT_REPEATS,
    DEFAULT_TRIAL_TIMEOUT_S,
)

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
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="an axis: any config key, dotted (training.dataloader_num_workers) or a bare "
        "TrainingArguments name (dataloader_num_workers); repeat for more axes",
    )
    p.add_argument(
        "--hold-global-batch",
        action="store_true",
        help="vary micro-batch x accumulation at the current effective batch only",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="search the grid on an Optuna study instead of measuring every point (resumable); "
        "points clearly slower than the best in their first windows are pruned",
    )
    p.add_argument(
        "--search",
        choices=("climb", "tpe"),
        default="climb",
        help="--adaptive's strategy on the Optuna study: climb (one axis at a time, default: "
        "fewer trials on worker x batch grids, see docs/sweep.md) or tpe (Optuna's TPE sampler)",
    )
    p.add_argument(
        "--study-storage",
        default=None,
        metavar="URL",
        help="--adaptive's Optuna storage: any Optuna URL (e.g. postgresql://..., for several "
        "drivers on one study); default a SQLite file in the trial cache, so a rerun resumes",
    )
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where trials run: local (one process at a time, default) or ray (Ray tasks, many "
        "at once; pip install 'gpudoctor[ray]')",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --backend ray: join this cluster (auto or HOST:PORT); default a local Ray "
        "instance for this sweep",
    )
    p.add_argument(
        "--emit-slurm",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a Slurm job array (one task per point, --shard under the hood) and its "
        "merge step to DIR instead of running trials",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run only slice I (0-based) of N; join with --merge",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        metavar="DIR",
        help="join the --out folders of finished shards into --out",
    )
    p.add_argument(
        "--target", default=None, help="price points on this GPU through preflight (e.g. h100)"
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="trial cache (default $GPUDOCTOR_SWEEP_CACHE or ~/.cache/gpudoctor/sweep)",
    )
    p.add_argument(
        "--max-trials",
        type=_int,
        default=DEFAULT_MAX_TRIALS,
        help=f"refuse to start more new trials than this without --yes (default {DEFAULT_MAX_TRIALS})",
    )
    p.add_argument("--yes", action="store_true", help="run a grid larger than --max-trials")
    p.add_argument(
        "--trial-timeout",
        type=_float,
        default=DEFAULT_TRIAL_TIMEOUT_S,
        metavar="S",
        help=f"stop a trial that runs longer (a hang) (default {DEFAULT_TRIAL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--warmup-s",
        type=_float,
        default=2.0,
        metavar="S",
        help="seconds after the first batch left out of the measurement (default 2)",
    )
    p.add_argument(
        "--window-s", type=_float, default=2.0, metavar="S", help="length of one window (default 2)"
    )
    p.add_argument(
        "--windows", type=_int, default=3, help="measurement windows per trial (default 3)"
    )
    p.add_argument(
        "--noise",
        type=_float,
        default=DEFAULT_NOISE,
        metavar="F",
        help=f"repeat a point whose windows spread more than F (default {DEFAULT_NOISE:g})",
    )
    p.add_argument(
        "--repeats",
        type=_int,
        default=DEFAULT_REPEATS,
        help=f"extra runs at most for a noisy point (default {DEFAULT_REPEATS})",
    )
    p.add_argument(
        "--torch-threads",
        type=_int,
        default=None,
        metavar="N",
        help="intra-op threads per trial (default: 1 without a GPU, PyTorch's own with one; 0: PyTorch's)",
    )
