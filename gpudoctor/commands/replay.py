"""``gpudoctor replay CONFIG.yaml [--target GPU]``: diagnose a config before renting GPUs.

The config's pipeline and loop run as an ordinary training script
(``gpudoctor.replay.worker``) under the same ``run`` machinery, so the
findings come from the same hooks and rules. With a target GPU, the worker's
measurements feed the preflight model (``gpudoctor.replay.preflight``), and
the report gains a ``preflight`` section: the full run before and after fixes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from gpudoctor.errors import UserError


def main(args: Any) -> int:
    from gpudoctor.commands import run as run_cmd
    from gpudoctor.pipeline import finish
    from gpudoctor.replay.config import load_config
    from gpudoctor.report import ReportOptions

    config = load_config(args.config)  # one-line UserError naming the key and line
    target = args.target or config.hardware.target
    if target:
        from gpudoctor.replay.gpus import lookup

        lookup(target)  # unknown GPU: list the known ones before any work is done
    worker = [sys.executable, "-m", "gpudoctor.replay.worker", str(args.config)]
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
    price = args.price_per_gpu_hour if args.price_per_gpu_hour is not None else config.hardware.price_per_gpu_hour
    code, report, folder = run_cmd.run([*worker, *bounds], args.out, 0.1, price, args.gpus, as_json=False,
                                       mode="replay")
    from gpudoctor.replay.scratch import remove_all

    remove_all(folder)  # a killed worker skipped its own cleanup: its checkpoints go now
    if code != 0 or report is None:
        if args.json and report is not None:
            print(json.dumps(report, indent=2))
        return code
    measure_path = folder / "replay_measure.json"
    measure = json.loads(measure_path.read_text()) if measure_path.exists() else None
    extra: dict[str, Any] = {}
    if measure is not None:
        from gpudoctor.replay.here import compare

        check = compare(config, measure, report, mfu=args.mfu)  # on a GPU: prediction beside measurement
        if check is not None:
            extra["prediction_check"] = check
    prediction = None
    if target:
        if measure is None:
            raise UserError(f"the replay wrote no {measure_path.name}; the prediction needs it (see {folder})")
        from gpudoctor.replay.here import ON_CPU_NOTE
        from gpudoctor.replay.preflight import predict

        prediction = predict(config, measure, target=target, mfu=args.mfu,
                             price_per_gpu_hour=args.price_per_gpu_hour, gpus_count=args.gpus,
                             recorded_padding=report.get("padding"))  # the finding's lengths
        if "prediction_check" not in extra:
            prediction["notes"].append(ON_CPU_NOTE)
        extra["preflight"] = prediction
    if extra:
        report = finish(folder, ReportOptions(price_per_gpu_hour=price, gpus=args.gpus), extra=extra)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from gpudoctor.render.preflight import check_markdown, markdown

    if "prediction_check" in extra:
        print("\n" + check_markdown(extra["prediction_check"]), file=sys.stderr)
    if prediction is not None:
        print("\n" + markdown(prediction), file=sys.stderr)
    if extra:
        print(f"  report: {folder / 'report.html'}", file=sys.stderr)
    return 0
