"""``gpudoctor replay CONFIG.yaml | RUN_FOLDER [--training-args F] [--model-config F] [--target GPU]``.

The config's pipeline and loop run as an ordinary training script
(``gpudoctor.replay.worker``) under the same ``run`` machinery, so the
findings come from the same hooks and rules. With a target GPU, the worker's
measurements feed the preflight model (``gpudoctor.replay.preflight``), and
the report gains a ``preflight`` section: the full run before and after fixes.

Given a recorded run folder or a Trainer checkpoint's JSON files instead of a
YAML, the config is derived from them first (:mod:`gpudoctor.replay.derive`) and
written as ``replay.yaml`` in the output folder, each value with its source.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.commands import flags
from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.processes import childpy

if TYPE_CHECKING:
    from gpudoctor.core.schema import Added, Report
    from gpudoctor.launch.launcher import View
    from gpudoctor.replay.config import ReplayConfig
    from gpudoctor.replay.derive import Derived

HELP = "run a training config for a bounded time and diagnose it"
DESCRIPTION = ("Rebuild a training config's pipeline (dataset, tokenizer, collator, DataLoader, model) here, "
               "run it for a bounded time under the doctor, and predict the full run on --target, a GPU you "
               "have not rented (docs/replay.md). The config can be derived from a recorded run folder or a "
               "Trainer checkpoint's JSON files; it is then written as replay.yaml in --out, each value with "
               "its source.")

DERIVED_FILE = "replay.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, nargs="?", metavar="CONFIG|RUN",
                   help="replay config YAML (see sample_configs/README.md), or a run folder recorded by "
                   "gpudoctor run to derive one from")
    p.add_argument("--training-args", type=Path, default=None, metavar="JSON",
                   help="TrainingArguments.to_json_string() output (not training_args.bin: a pickle is never loaded)")
    p.add_argument("--model-config", type=Path, default=None, metavar="JSON",
                   help="the model's config.json: its architecture and size")
    flags.add_common(p)
    p.add_argument("--target", default=None, help="predict the full run on this GPU (e.g. h100)")
    p.add_argument("--max-steps", type=flags.count, default=None, metavar="N",
                   help="stop after N optimizer steps or --max-seconds, whichever comes first "
                   "(default: the config's replay.steps, 20)")
    p.add_argument("--max-seconds", type=flags.positive, default=None, metavar="S",
                   help="stop after S seconds of training (default: the config's replay.seconds, 30)")
    p.add_argument("--mfu", type=flags.bounded(0, 1), default=None,
                   help="assumed model FLOPs utilization for predictions (default hardware.mfu, 0.4)")
    flags.add_history(p)
    flags.add_quiet(p)


def _progress(args: argparse.Namespace, config: ReplayConfig) -> Callable[[Path], View] | None:
    """The progress line at the bottom of a terminal (gpudoctor/live/view.py), or None (no terminal, --quiet, ...)."""
    from gpudoctor.live.view import replay_progress
    from gpudoctor.render.progress import live_output
    from gpudoctor.replay.bounds import replay_bounds

    if not live_output(sys.stderr, quiet=args.quiet, as_json=args.json):
        return None
    b = replay_bounds(config, args.max_steps, args.max_seconds)
    return lambda folder: replay_progress(folder, b.max_steps, b.max_seconds, sys.stderr)


def prepare_first(worker: list[str], config: ReplayConfig) -> bool:
    """Build the data/tokenizer cache before the profiled run, unprofiled: it is this tool's setup, not
    the config's startup. A config replayed again finds its folder without a worker (True: one was run)."""
    from gpudoctor.replay.cache import prepared

    if prepared(config) is not None:
        return False
    prep = subprocess.run([*worker, "--prepare-only"], capture_output=True, text=True, env=childpy.doctor_env())
    if prep.returncode != 0:
        lines = (prep.stderr or prep.stdout).strip().splitlines()
        raise UserError(lines[-1].removeprefix("gpudoctor: ") if lines else "replay preparation failed", prep.returncode)
    return True


def main(args: argparse.Namespace) -> int:
    # the config loader (yaml), the launcher and the preflight model load only when a replay runs
    from gpudoctor.launch import launcher as launch
    from gpudoctor.pipeline import add_sections
    from gpudoctor.replay.config import load_config
    from gpudoctor.replay.gpus import lookup
    from gpudoctor.replay.scratch import remove_all

    config_path, derived = _config_path(args)
    config = load_config(config_path)  # one-line UserError naming the key and line
    target = args.target or config.hardware.target
    if target:
        lookup(target)  # unknown GPU: list the known ones before any work is done
    # The doctor's own interpreter, isolated (-I): nothing of the current folder's is imported (childpy)
    worker = childpy.isolated("gpudoctor.replay.worker", str(config_path))
    prepare_first(worker, config)
    bounds = []
    if args.max_steps is not None:
        bounds += ["--max-steps", str(args.max_steps)]
    if args.max_seconds is not None:
        bounds += ["--max-seconds", str(args.max_seconds)]
    price, price_source = _price(args, config, config_path)
    gpus = args.gpus if args.gpus is not None else (config.hardware.gpus if price is not None else None)
    ran = launch.run(launch.RunSpec([*worker, *bounds], args.out, price_per_gpu_hour=price, gpus=gpus,
                                    price_source=price_source, mode="replay", shown_command=user_command(args),
                                    extra_env={"PATH": childpy.SYSTEM_PATH}, view=_progress(args, config)))
    code, report, folder = ran.code, ran.report, ran.folder
    remove_all(folder)  # a killed worker skipped its own cleanup: its checkpoints go now
    if code != 0 or report is None:
        if args.json and report is not None:
            say(json.dumps(report, indent=2), file=sys.stdout)
        if report is not None:
            flags.record_history(args, report, folder)
        return code
    extra = _sections(args, config, folder, report, target, price, gpus, derived)
    if extra:  # the report the launcher built, its recording not analysed again
        report = add_sections(report, folder, extra)
    if args.json:
        say(json.dumps(report, indent=2), file=sys.stdout)
    else:
        _say_sections(extra, folder)
    flags.record_history(args, report, folder)
    return 0


def _say_sections(extra: Added, folder: Path) -> None:
    from gpudoctor.render.preflight import check_markdown, markdown

    if "prediction_check" in extra:
        say("\n" + check_markdown(extra["prediction_check"]), file=sys.stderr)
    if "preflight" in extra:
        say("\n" + markdown(extra["preflight"]), file=sys.stderr)
    if extra:
        say(f"  report: {folder / 'report.html'}", file=sys.stderr)


def _sections(args: argparse.Namespace, config: ReplayConfig, folder: Path, report: Report,
              target: str | None, price: float | None, gpus: int | None, derived: Derived | None) -> Added:
    """The replay's own report sections: the prediction checked on this GPU, the preflight, and
    (for a derived config) where each value came from."""
    from gpudoctor.replay.here import ON_CPU_NOTE, compare
    from gpudoctor.replay.preflight import predict

    measure_path = folder / "replay_measure.json"
    measure = json.loads(measure_path.read_text()) if measure_path.exists() else None
    extra: Added = {}
    if measure is not None:
        check = compare(config, measure, report, mfu=args.mfu)  # on a GPU: prediction beside measurement
        if check is not None:
            extra["prediction_check"] = check
    origin = derived.notes() if derived is not None else []
    if target:
        if measure is None:
            raise UserError(f"the replay wrote no {measure_path.name}; the prediction needs it (see {folder})")
        prediction = predict(config, measure, target=target, mfu=args.mfu, price_per_gpu_hour=price,
                             gpus_count=gpus, recorded_padding=report.get("padding"))  # the finding's lengths
        if "prediction_check" not in extra:
            prediction["notes"].append(ON_CPU_NOTE)
        prediction["notes"].extend(origin)
        extra["preflight"] = prediction
    elif origin:
        extra["notes"] = [*(report.get("notes") or []), *origin]
    return extra


def _config_path(args: argparse.Namespace) -> tuple[Path, Derived | None]:
    """The YAML to replay: the one given, or one derived from a run folder / checkpoint files."""
    from gpudoctor.launch.recorder import default_out
    from gpudoctor.replay import derive, facts

    given: Path | None = args.config
    files = args.training_args is not None or args.model_config is not None
    if given is None and not files:
        raise UserError("replay needs a config YAML, a run folder recorded by 'gpudoctor run' "
                        "(gpudoctor replay reports/run-.../ --target h100), or a checkpoint's files "
                        "(--training-args training_args.json --model-config config.json)")
    if given is not None and not given.is_dir():
        if files:
            raise UserError(f"{given} is a config file, which already says everything; --training-args and "
                            "--model-config go with a run folder, or alone")
        return given, None
    found = facts.from_run(given) if given is not None else facts.RunFacts()
    found = facts.add_files(found, args.training_args, args.model_config)
    derived = derive.derive(found, target=args.target)
    out = args.out or default_out("replay")
    os.close(safefs.open_private_folder(out, "--out"))  # refused in one line before anything starts
    args.out = out
    path = out / DERIVED_FILE
    safefs.replace_file(path, derived.yaml_text(" ".join(["gpudoctor", "replay", str(path), *_target(args)])))
    say(f"gpudoctor: replay config derived from {derived.origin}: {path} (each value says where it came "
        "from; edit it and replay it)", file=sys.stderr)
    return path, derived


def _target(args: argparse.Namespace) -> list[str]:
    return ["--target", args.target] if args.target else []


def _price(args: argparse.Namespace, config: ReplayConfig, path: Path) -> tuple[float | None, str | None]:
    """The price and where it came from: the command line wins over the config's hardware section."""
    if args.price_per_gpu_hour is not None:
        return args.price_per_gpu_hour, "--price-per-gpu-hour"
    if config.hardware.price_per_gpu_hour is not None:
        return config.hardware.price_per_gpu_hour, f"hardware.price_per_gpu_hour in {path}"
    return None, None


def user_command(args: argparse.Namespace) -> list[str]:
    """The ``gpudoctor replay ...`` command as the user could have typed it (the report shows this,
    not the internal worker's command line; the recorder redacts it like any other)."""
    command = ["gpudoctor", "replay"] + ([str(args.config)] if args.config is not None else [])
    for flag, value in (("--training-args", args.training_args), ("--model-config", args.model_config),
                        ("--target", args.target), ("--max-steps", args.max_steps),
                        ("--max-seconds", args.max_seconds), ("--mfu", args.mfu),
                        ("--price-per-gpu-hour", args.price_per_gpu_hour), ("--gpus", args.gpus)):
        if value is not None:
            command += [flag, str(value)]
    return command + (["--json"] if args.json else [])
