"""One ``gpudoctor sweep`` from options to a written folder: plan the points, run
them (all, a shard, or adaptively), and keep ``sweep.json`` current throughout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError
from gpudoctor.recorder import default_out
from gpudoctor.sweep import adaptive, results
from gpudoctor.sweep import points as pts
from gpudoctor.sweep.axes import parse_grid
from gpudoctor.sweep.cache import TrialCache
from gpudoctor.sweep.monitor import open_nvml
from gpudoctor.sweep.options import SweepOptions
from gpudoctor.sweep.output import write_outputs
from gpudoctor.sweep.plan import Plan, build_plan, effective_batch, parse_shard, shard
from gpudoctor.sweep.points import Resolved, resolve
from gpudoctor.sweep.progress import Display
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
    setup = _setup(opts)
    todo = need_trials(setup.items, setup.runner.cache)
    if not opts.adaptive:
        check_limit(len(todo), opts.max_trials, opts.yes)
    doc, runner = setup.doc, setup.runner
    with Display(len(todo), "sweep") as display:
        runner.display = display
        try:
            if opts.adaptive:
                _adaptive(setup.items, setup.plan, runner, doc)
            else:
                doc["points"] = [i.entry for i in setup.items]
                new = {id(i) for i in todo}
                for item in sorted(setup.items, key=lambda i: id(i) in new):  # cached ones first
                    runner.evaluate(item)
        except KeyboardInterrupt:
            doc["notes"].append("interrupted: the points not measured are pending")
            runner.on_change()
            raise
    doc["trials_run"] = runner.trials_run
    runner.on_change()
    display.table(doc)
    return doc, setup.folder


def _setup(opts: SweepOptions) -> Setup:
    """Load and check everything, and make each point concrete, before any trial starts."""
    from gpudoctor.replay.config import load_config

    assert opts.config is not None
    cfg = load_config(opts.config)
    axes = parse_grid(opts.grid)
    if opts.target:
        from gpudoctor.replay.gpus import lookup

        lookup(opts.target)  # an unknown GPU fails before any trial
    target = opts.target or cfg.hardware.target
    cores, nvml = results.available_cores(), open_nvml()
    threads = opts.protocol.torch_threads
    protocol = dataclasses.replace(
        opts.protocol, torch_threads=(0 if nvml else 1) if threads is None else threads
    )
    plan = build_plan(cfg, axes, opts.hold_global_batch, cores)
    raw, base_dir = pts.read_raw(opts.config), opts.config.resolve().parent
    grid = _grid_doc(plan, cfg, opts)
    doc = results.new_doc(
        opts.config, cfg.sha256(), grid, protocol.as_dict(), plan.notes, opts.argv
    )
    doc["target"] = target
    items = []
    for p in shard(plan.points, opts.shard):
        entry = results.point_entry(p.index, p.params, p.baseline, effective_batch(p.params, cfg))
        items.append(resolve(p, entry, raw, base_dir, plan.fixed, protocol.as_dict(), cores))
    folder = opts.out or default_out("sweep")
    costs = {"target": target, "price": opts.price_per_gpu_hour, "gpus_count": opts.gpus}
    runner = Runner(
        TrialCache(opts.cache),
        protocol,
        opts.trial_timeout_s,
        opts.noise,
        opts.repeats,
        nvml,
        costs,
        lambda: write_outputs(doc, folder),
    )
    return Setup(plan, items, doc, runner, folder)


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


def _adaptive(items: list[Resolved], plan: Plan, runner: Runner, doc: dict[str, Any]) -> None:
    """Coordinate ascent over the grid; the current setting is measured too, for the speedup."""
    by_index = {i.point.index: i for i in items}

    def score(point: Any) -> float | None:
        entry = by_index[point.index].entry
        if entry not in doc["points"]:
            doc["points"].append(entry)
            runner.evaluate(by_index[point.index])
        return results.score(entry)

    grid = [i.point for i in items if i.point.index < plan.grid_size]
    start = adaptive.start_point(grid, plan.baseline, plan.grid_size)
    if start is None:
        raise UserError("--adaptive: no grid point can run here (all skipped); see the notes above")
    climb = adaptive.climb(
        grid, adaptive.groups(list(plan.baseline), plan.hold_global_batch), start, score
    )
    for point in plan.points[plan.grid_size :]:
        score(point)  # the current setting, outside the grid
    doc["adaptive"] = {
        "method": "coordinate ascent (one axis at a time)",
        "trials_used": len(doc["points"]),
        "grid_points": len(plan.points),
        "passes": climb.passes,
        "path": climb.visited,
        **_full_grid_winner(items, runner.cache, results.best_point(doc["points"])),
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
