"""``python -m gpudoctor.replay.worker CONFIG --max-steps N --max-seconds S``

An honest training script built from a replay config: load the prepared data,
do the config's startup work, build the model and DataLoader, train a bounded
number of steps. ``gpudoctor run`` profiles it from outside; this module never
imports gpudoctor's hooks. With ``$GPUDOCTOR_RUN_DIR`` set (or ``--measure-out``)
it writes ``replay_measure.json`` with what only it can measure, for preflight.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say

MEASURE_FILE = "replay_measure.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpudoctor.replay.worker", description=__doc__.split("\n\n")[1]
    )
    p.add_argument("config", help="replay config YAML")
    p.add_argument(
        "--max-steps", type=int, default=None, help="optimizer steps (default: replay.steps)"
    )
    p.add_argument(
        "--max-seconds", type=float, default=None, help="training seconds (default: replay.seconds)"
    )
    p.add_argument(
        "--prepare-only", action="store_true", help="build the data/tokenizer cache and exit"
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="cache folder (default: $GPUDOCTOR_REPLAY_CACHE or ~/.cache/gpudoctor/replay)",
    )
    p.add_argument(
        "--measure-out",
        type=Path,
        default=None,
        help=f"write {MEASURE_FILE} here instead of $GPUDOCTOR_RUN_DIR",
    )
    p.add_argument(
        "--no-measure", action="store_true", help="skip the pipeline timing before training"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _run(args)
    except UserError as exc:
        say(f"gpudoctor: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    t_process = time.time()
    # Imported here, after t_process: the worker times its own start, and what each stage imports
    # (tokenizers, datasets, torch, transformers) is part of that stage's measured time.
    from gpudoctor.replay.config import load_config

    cfg = load_config(args.config)
    for name, value in (("--max-steps", args.max_steps), ("--max-seconds", args.max_seconds)):
        if value is not None and value <= 0:
            raise UserError(f"{name} must be positive, got {value}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from gpudoctor.replay import prepare  # see above

    t0 = time.perf_counter()
    folder, meta = prepare.prepare(cfg, args.cache)
    prepare_s = time.perf_counter() - t0
    if args.prepare_only:
        say(f"replay: prepared {meta['examples']} examples in {folder}", file=sys.stdout)
        return 0
    return _train(cfg, args, folder, meta, prepare_s, t_process)


def _train(
    cfg: Any,
    args: argparse.Namespace,
    folder: Path,
    meta: dict[str, Any],
    prepare_s: float,
    t_process: float,
) -> int:
    # timed as the replay's startup (see _run)
    from gpudoctor.replay import build, loop, measure, prepare
    from gpudoctor.replay.bounds import replay_bounds

    t0 = time.perf_counter()
    data, tokenizer = prepare.load_prepared(folder)
    t_load = time.perf_counter()
    model = build.build_model(cfg, tokenizer)
    t_model = time.perf_counter()
    pipe = build.build_pipeline(cfg, data, tokenizer)
    t_pipe = time.perf_counter()
    device = loop.pick_device(cfg)
    bounds = replay_bounds(cfg, args.max_steps, args.max_seconds)
    runner = loop.run_trainer if cfg.loop == "trainer" else loop.run_plain
    result = runner(cfg, pipe, model, bounds, device)
    # Timed after training, so the profiled startup and loop are the config's own.
    t_pipe_measure = time.perf_counter()
    pipeline_measure = None
    window = [time.time(), time.time()]
    if not args.no_measure:
        pipeline_measure = measure.measure_pipeline(
            pipe,
            cfg.training.per_device_train_batch_size,
            cfg.replay.measure_batches,
            cfg.replay.measure_seconds,
        )
        window[1] = time.time()
    t_measure = time.perf_counter()
    setup = {
        "prepare_s": prepare_s,
        "load_s": t_load - t0,
        "model_build_s": t_model - t_load,
        "startup_work_s": t_pipe - t_model,
        "measure_s": t_measure - t_pipe_measure,
    }
    report = _measure_doc(
        cfg, meta, pipe, model, pipeline_measure, result, bounds, device, setup, window, t_process
    )
    _write_measure(report, args.measure_out)
    loss = f", loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}" if result.losses else ""
    say(
        f"replay: {result.steps} steps ({result.micro_steps} micro-batches) in {result.seconds:.1f} s, "
        f"stopped by {result.stopped_by}{loss}",
        file=sys.stdout,
    )
    return 0


def _measure_doc(
    cfg: Any,
    meta: dict[str, Any],
    pipe: Any,
    model: Any,
    pipeline_measure: dict[str, Any] | None,
    result: Any,
    bounds: Any,
    device: Any,
    setup: dict[str, float],
    window: list[float],
    t_process: float,
) -> dict[str, Any]:
    import torch

    from gpudoctor.replay import measure  # timed as the replay's startup (_run)

    params = sum(p.numel() for p in model.parameters())
    n = pipe.startup_examples
    startup = {"examples": n}
    for key in ("format_s", "tokenize_s"):
        seconds = pipe.startup_s.get(key)
        startup[key] = seconds
        startup[key.replace("_s", "_examples_per_s")] = (n / seconds) if seconds else None
    ckpt = result.checkpoint_s
    cfg_model = model.config
    return {
        "schema": measure.SCHEMA,
        "config": cfg.source,
        "config_sha256": cfg.sha256(),
        "process_started_at_unix": t_process,
        "measure_window_unix": window,
        "device": device.type,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "examples_replayed": meta["examples"],
        "dataset_rows_total": meta["rows_total"],
        "replayed_model": {
            "params": params,
            "class": type(model).__name__,
            "n_layers": getattr(cfg_model, "num_hidden_layers", None),
            "hidden_size": getattr(cfg_model, "hidden_size", None),
        },
        "tokens": measure.token_stats(
            meta["raw_lengths"],
            cfg.max_length,
            cfg.padding,
            cfg.training.per_device_train_batch_size,
        ),
        "pipeline": pipeline_measure,
        "startup_work": startup,
        "checkpoint": {
            "count": len(ckpt),
            "every_steps": bounds.save_steps,
            "write_s_mean": sum(ckpt) / len(ckpt) if ckpt else None,
            "bytes": result.checkpoint_bytes or None,
            "bytes_per_param": result.checkpoint_bytes / params if ckpt else None,
        },
        "training": {
            **result.as_dict(),
            "max_steps": bounds.max_steps,
            "max_seconds": bounds.max_seconds,
            "loop": cfg.loop,
        },
        "setup_s": setup,
        "prepare": {"cache_hit": meta.get("cache_hit"), **meta.get("timings_s", {})},
    }


def _write_measure(doc: dict[str, Any], out: Path | None) -> None:
    target = out or (
        Path(os.environ["GPUDOCTOR_RUN_DIR"]) if os.environ.get("GPUDOCTOR_RUN_DIR") else None
    )
    if target is None:
        return
    path = target if target.suffix == ".json" else target / MEASURE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
