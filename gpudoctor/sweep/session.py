"""One ``gpudoctor sweep`` from options to a written folder: plan the points, run them
(all, a shard, or adaptively; here or on Ray), and keep ``sweep.json`` current throughout;
or write the Slurm scripts that run it as a job array.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.common.redact import redact_value
from gpudoctor.launch.recorder import default_out
from gpudoctor.replay.config import ReplayConfig, load_config
from gpudoctor.replay.gpus import lookup
from gpudoctor.sweep import adaptive, results, slurm
from gpudoctor.sweep import points as pts
from gpudoctor.sweep.axes import parse_grid
from gpudoctor.sweep.backend import Backend, LocalBackend
from gpudoctor.sweep.cache import TrialCache
from gpudoctor.sweep.options import SweepOptions
from gpudoctor.sweep.output import write_outputs
from gpudoctor.sweep.plan import Plan, build_plan, effective_batch, parse_shard, shard
from gpudoctor.sweep.points import Resolved, resolve
from gpudoctor.sweep.progress import Display
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.runner import Runner


@dataclass
class Setup:
    """Everything a sweep decided before its first trial."""

    plan: Plan
    items: list[Resolved]
    doc: dict[str, Any]
    runner: Runner
    folder: Path


def run_sweep(opts: SweepOptions) -> tuple[dict[str, Any], Path]:
    """Measure the points; return the document and the folder it was written to."""
    backend = _backend(opts)
    try:
        return _run(opts, backend)
    finally:
        backend.close()


def _run(opts: SweepOptions, backend: Backend) -> tuple[dict[str, Any], Path]:
    setup = _setup(opts, backend)
    todo = need_trials(setup.items, setup.runner.cache)
    if not opts.adaptive:
        check_limit(len(todo), opts.max_trials, opts.yes)
    doc, runner = setup.doc, setup.runner
    with Display(len(todo), "sweep", live=not opts.quiet and not opts.as_json) as display:
        runner.display = display
        backend.on_start = lambda job: display.running(job.label, job.attempt)
        try:
            if opts.adaptive:
                _adaptive(setup, opts, backend)
            else:
                doc["points"] = [i.entry for i in setup.items]
                runner.evaluate_all(setup.items)
        except KeyboardInterrupt:
            doc["notes"].append("interrupted: the points not measured are pending")
            runner.on_change()
            raise
    doc["trials_run"] = runner.trials_run
    runner.on_change()
    display.table(doc)
    return doc, setup.folder


def _backend(opts: SweepOptions) -> Backend:
    if opts.backend == "ray":
        # ray is optional and heavy: its module (and ray) load only for --backend ray
        from gpudoctor.sweep.ray_backend import RayBackend

        return RayBackend(opts.ray_address)
    return LocalBackend()


def _load(opts: SweepOptions, cores: int) -> tuple[ReplayConfig, Plan]:
    """The config, grid and plan, checked before anything runs."""
    assert opts.config is not None
    cfg = load_config(opts.config)
    axes = parse_grid(opts.grid)
    if opts.target:
        lookup(opts.target)  # an unknown GPU fails before any trial
    return cfg, build_plan(cfg, axes, opts.hold_global_batch, cores)


def _setup(opts: SweepOptions, backend: Backend) -> Setup:
    """Load and check everything, and make each point concrete, before any trial starts."""
    assert opts.config is not None
    cores = backend.cores
    cfg, plan = _load(opts, cores)
    target = opts.target or cfg.hardware.target
    protocol = _protocol(opts.protocol, backend.gpu)
    raw, base_dir = pts.read_raw(opts.config), opts.config.resolve().parent
    grid = _grid_doc(plan, cfg, opts)
    doc = results.new_doc(
        opts.config, cfg.sha256(), grid, protocol.as_dict(), plan.notes, opts.argv
    )
    doc["target"] = target
    doc["backend"] = {
        "name": backend.name,
        "address": redact_value(opts.ray_address) if opts.ray_address else None,
        "slots": backend.slots,
        "cores_per_trial_max": cores,
    }
    items = []
    for p in shard(plan.points, opts.shard):
        entry = results.point_entry(p.index, p.params, p.baseline, effective_batch(p.params, cfg))
        items.append(resolve(p, entry, raw, base_dir, plan.fixed, protocol.as_dict(), cores))
    folder = opts.out or default_out("sweep")
    costs = {"target": target, "price": opts.price_per_gpu_hour, "gpus_count": opts.gpus}
    runner = Runner(
        TrialCache(opts.cache),
        backend,
        protocol,
        opts.trial_timeout_s,
        opts.noise,
        opts.repeats,
        costs,
        lambda: write_outputs(doc, folder),
    )
    return Setup(plan, items, doc, runner, folder)


def _protocol(protocol: Protocol, gpu: bool) -> Protocol:
    """Intra-op threads: one beside a CPU stand-in model, PyTorch's own on a GPU (0)."""
    threads = protocol.torch_threads
    return dataclasses.replace(protocol, torch_threads=(0 if gpu else 1) if threads is None else threads)


def need_trials(items: list[Resolved], cache: TrialCache) -> list[Resolved]:
    """The points that would start a process (not skipped, not cached)."""
    return [i for i in items if i.key and not i.point.skip and cache.load(i.key) is None]


def check_limit(count: int, limit: int, yes: bool) -> None:
    if count > limit and not yes:
        raise UserError(
            f"the sweep would run {count} new trials (> --max-trials {limit}); pass --yes to run "
            "them all, or narrow the grid, --shard it, or use --adaptive"
        )


def _grid_doc(plan: Plan, cfg: Any, opts: SweepOptions) -> dict[str, Any]:
    return {
        "axes": [{"key": a.key, "values": list(a.values)} for a in plan.axes],
        "baseline": plan.baseline,
        "fixed": plan.fixed,
        "hold_global_batch": plan.hold_global_batch,
        "global_batch": plan.global_batch,
        "learning_rate": cfg.training.learning_rate,
        "points_total": len(plan.points),
        "grid_size": plan.grid_size,
        "shard": opts.shard,
        "shard_count": parse_shard(opts.shard)[1] if opts.shard else 1,
    }


def _adaptive(setup: Setup, opts: SweepOptions, backend: Backend) -> None:
    """The Optuna search over the grid; the current setting is measured too, for the speedup."""
    # optuna is optional: the search module (and optuna) load only for --adaptive
    from gpudoctor.sweep import search

    plan, runner, doc = setup.plan, setup.runner, setup.doc
    storage = opts.study_storage or search.default_storage(opts.cache)
    if opts.study_storage is None:
        runner.cache.make_root()  # private: it holds the default SQLite file
    name = search.study_name(doc)
    study = search.open_study(storage, name, search.prune_margin(opts.noise))
    grid = [i for i in setup.items if i.point.index < plan.grid_size]
    choices = {a.key: list(a.values) for a in plan.axes}
    pruning = backend.name == "local"  # a Ray task's windows are not read while it runs
    if opts.search == "tpe":
        found = search.run_tpe(
            grid, choices, runner, doc, study, opts.max_trials, backend.slots, pruning
        )
        method = f"Optuna TPE (seed {search.SEED})"
    else:
        groups = adaptive.groups(list(plan.baseline), plan.hold_global_batch)
        found = search.run_climb(
            grid, choices, groups, plan.baseline, runner, doc, study, opts.max_trials, pruning
        )
        method = "coordinate ascent on an Optuna study"
    method += ", pruning clearly slower points" if pruning else f", {backend.slots} at a time"
    outside = setup.items[plan.grid_size :]  # the current setting, when no grid point
    doc["points"] += [i.entry for i in outside]
    runner.evaluate_all(outside)
    best = results.best_point(doc["points"])
    doc["adaptive"] = {
        "method": method,
        "study": name,
        "storage": redact_value(storage),
        "trials_used": len(found.measured),
        "pruned": len(found.pruned),
        "resumed_trials": found.resumed_trials,
        "grid_points": len(plan.points),
        "stopped": found.stopped,
        "path": found.measured,
        "found_at_trial": found.measured.index(best["index"]) + 1
        if best and best["index"] in found.measured
        else None,
        **_full_grid_winner(setup.items, runner.cache, best),
    }


def _full_grid_winner(items: list[Resolved], cache: TrialCache, found: Any) -> dict[str, Any]:
    """Compare with the whole grid's winner when every point of it is already in the cache."""
    runnable = [i for i in items if not i.point.skip and i.key]
    records = {i.point.index: cache.load(i.key or "") for i in runnable}
    if not runnable or any(r is None for r in records.values()):
        return {"full_grid_known": False, "full_grid_best_index": None, "same_winner": None}
    speeds = {
        k: (r.get("metrics") or {}).get("samples_per_s")
        for k, r in records.items()
        if r and r["status"] == "ok"
    }
    winner = max(speeds, key=lambda k: (speeds[k], -k)) if speeds else None
    return {
        "full_grid_known": True,
        "full_grid_best_index": winner,
        "same_winner": found is not None and winner == found["index"],
    }


def merge_sweeps(opts: SweepOptions) -> tuple[dict[str, Any], Path]:
    """``--merge DIR...``: join shard folders into one sweep folder."""
    docs = [results.load_doc(d) for d in opts.merge]
    doc = results.merge(docs, [str(d) for d in opts.merge])
    folder = opts.out or default_out("sweep")
    write_outputs(doc, folder)
    return doc, folder


def emit_slurm(opts: SweepOptions) -> tuple[list[Path], int]:
    """``--emit-slurm DIR``: the job array and merge scripts; their paths and the point count."""
    assert opts.emit_slurm is not None
    local = LocalBackend()  # the GPU seen here decides whether the tasks ask for one
    _, plan = _load(opts, local.cores)
    return slurm.write_scripts(opts, plan, opts.emit_slurm, local.gpu), len(plan.points)
