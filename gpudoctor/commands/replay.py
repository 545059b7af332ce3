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

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpudoctor.common import childpy, safefs
from gpudoctor.common.errors import UserError
from gpudoctor.launch import launcher as launch
from gpudoctor.launch.recorder import default_out
from gpudoctor.pipeline import finish
from gpudoctor.render.preflight import check_markdown, markdown
from gpudoctor.replay import derive, facts
from gpudoctor.replay.config import ReplayConfig, load_config
from gpudoctor.replay.gpus import lookup
from gpudoctor.replay.here import ON_CPU_NOTE, compare
from gpudoctor.replay.preflight import predict
from gpudoctor.replay.scratch import remove_all
from gpudoctor.report.build import ReportOptions

DERIVED_FILE = "replay.yaml"


def main(args: Any) -> int:
    config_path, derived = _config_path(args)
    config = load_config(config_path)  # one-line UserError naming the key and line
    target = args.target or config.hardware.target
    if target:
        lookup(target)  # unknown GPU: list the known ones before any work is done
    # The doctor's own interpreter, isolated (-I): nothing of the current folder's is imported (childpy)
    worker = childpy.isolated("gpudoctor.replay.worker", str(config_path))
    # Build the data/tokenizer cache first, unprofiled: it is this tool's setup, not the config's startup.
    prep = subprocess.run([*worker, "--prepare-only"], capture_output=True, text=True)
    if prep.returncode != 0:
        lines = (prep.stderr or prep.stdout).strip().splitlines()
        raise UserError(lines[-1].removeprefix("gpudoctor: ") if lines else "replay preparation failed", prep.returncode)
    bounds = []
    if args.max_steps is not None:
        bounds += ["--max-steps", str(args.max_steps)]
    if args.max_seconds is not None:
        bounds += ["--max-seconds", str(args.max_seconds)]
    price, price_source = _price(args, config, config_path)
    gpus = args.gpus if args.gpus is not None else (config.hardware.gpus if price is not None else None)
    code, report, folder = launch.run([*worker, *bounds], args.out, 0.1, price, gpus, as_json=False,
                                       mode="replay", shown_command=user_command(args),
                                       price_source=price_source)
    remove_all(folder)  # a killed worker skipped its own cleanup: its checkpoints go now
    if code != 0 or report is None:
        if args.json and report is not None:
            print(json.dumps(report, indent=2))
        return code
    extra = _sections(args, config, folder, report, target, price, gpus, derived)
    if extra:  # the options are meta.json's (price, its source, GPUs): the first report's
        report = finish(folder, ReportOptions(), extra=extra)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if "prediction_check" in extra:
        print("\n" + check_markdown(extra["prediction_check"]), file=sys.stderr)
    if "preflight" in extra:
        print("\n" + markdown(extra["preflight"]), file=sys.stderr)
    if extra:
        print(f"  report: {folder / 'report.html'}", file=sys.stderr)
    return 0


def _sections(args: Any, config: ReplayConfig, folder: Path, report: dict[str, Any], target: str | None,
              price: float | None, gpus: int | None, derived: derive.Derived | None) -> dict[str, Any]:
    """The replay's own report sections: the prediction checked on this GPU, the preflight, and
    (for a derived config) where each value came from."""
    measure_path = folder / "replay_measure.json"
    measure = json.loads(measure_path.read_text()) if measure_path.exists() else None
    extra: dict[str, Any] = {}
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


def _config_path(args: Any) -> tuple[Path, derive.Derived | None]:
    """The YAML to replay: the one given, or one derived from a run folder / checkpoint files."""
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
    safefs.private_dir(out, "--out")
    args.out = out
    path = out / DERIVED_FILE
    safefs.replace_file(path, derived.yaml_text(" ".join(["gpudoctor", "replay", str(path), *_target(args)])))
    print(f"gpudoctor: replay config derived from {derived.origin}: {path} (each value says where it came "
          "from; edit it and replay it)", file=sys.stderr)
    return path, derived


def _target(args: Any) -> list[str]:
    return ["--target", args.target] if args.target else []


def _price(args: Any, config: ReplayConfig, path: Path) -> tuple[float | None, str | None]:
    """The price and where it came from: the command line wins over the config's hardware section."""
    if args.price_per_gpu_hour is not None:
        return args.price_per_gpu_hour, "--price-per-gpu-hour"
    if config.hardware.price_per_gpu_hour is not None:
        return config.hardware.price_per_gpu_hour, f"hardware.price_per_gpu_hour in {path}"
    return None, None


def user_command(args: Any) -> list[str]:
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
