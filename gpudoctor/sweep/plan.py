"""The points of a sweep: the grid's product, held at one effective batch if asked,
plus the user's current setting, with worker counts checked against the cores.

A point is only its parameters (dotted key -> value); its index is its place in
the full list, so every shard of a sweep numbers the points the same way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.sweep.axes import ACCUM, BATCH, GPUS, WORKERS, Axis, current_value

BATCH_KEYS = (BATCH, ACCUM, GPUS)


@dataclass
class Point:
    index: int
    params: dict[str, Any]
    baseline: bool = False
    skip: str | None = None


@dataclass
class Plan:
    axes: list[Axis]
    points: list[Point]
    baseline: dict[str, Any]
    fixed: dict[str, Any] = field(default_factory=dict)
    hold_global_batch: bool = False
    global_batch: int = 1
    grid_size: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return list(self.baseline)


def effective_batch(params: dict[str, Any], cfg: ReplayConfig) -> int:
    """Samples per optimizer step: micro-batch x accumulation x data-parallel GPUs."""
    value = 1
    for key in BATCH_KEYS:
        value *= int(params.get(key, current_value(cfg, key)))
    return value


def build_plan(cfg: ReplayConfig, axes: list[Axis], hold: bool, cores: int) -> Plan:
    """Every point of the grid, in order, with the current setting appended if missing."""
    combos = [
        dict(zip([a.key for a in axes], values, strict=True))
        for values in itertools.product(*(a.values for a in axes))
    ]
    plan = Plan(axes, [], {}, hold_global_batch=hold, global_batch=effective_batch({}, cfg))
    if hold:
        combos = _hold(combos, axes, cfg, plan)
    keys = list(dict.fromkeys(k for c in combos for k in c))
    plan.baseline = {k: current_value(cfg, k) for k in keys}
    base_workers = current_value(cfg, WORKERS)
    if WORKERS not in keys and base_workers > cores:
        plan.fixed[WORKERS] = cores
        plan.notes.append(
            f"dataloader_num_workers {base_workers} is more than the {cores} cores here: "
            f"every trial runs with {cores}"
        )
    plan.points = [Point(i, c) for i, c in enumerate(combos)]
    plan.grid_size = len(combos)
    if plan.baseline not in combos:
        plan.points.append(Point(len(combos), dict(plan.baseline), baseline=True))
    for point in plan.points:
        point.baseline = point.baseline or point.params == plan.baseline
        workers = point.params.get(WORKERS)
        if workers is not None and workers > cores:
            point.skip = (
                f"{workers} workers > {cores} cores here: "
                "it would measure this box's contention, not the setting"
            )
    too_many = sorted({p.params[WORKERS] for p in plan.points if p.skip})
    if too_many:
        listed = ", ".join(map(str, too_many))
        plan.notes.append(
            f"dataloader_num_workers {listed}: skipped, more than the {cores} cores here"
        )
    _batch_note(plan, cfg)
    return plan


def _hold(
    combos: list[dict[str, Any]], axes: list[Axis], cfg: ReplayConfig, plan: Plan
) -> list[dict[str, Any]]:
    """Keep (or complete) combinations whose effective batch equals the current one."""
    keys = {a.key for a in axes}
    if not keys & {BATCH, ACCUM}:
        raise UserError(
            "--hold-global-batch needs a per_device_train_batch_size or gradient_accumulation_steps axis"
        )
    target = plan.global_batch
    kept: list[dict[str, Any]] = []
    for combo in combos:
        free = next((k for k in (ACCUM, BATCH) if k not in keys), None)
        if free is not None:
            rest = effective_batch({**combo, free: 1}, cfg)
            if target % rest:
                continue
            combo = {**combo, free: target // rest}
        if effective_batch(combo, cfg) == target:
            kept.append(combo)
    if not kept:
        raise UserError(
            f"--hold-global-batch: no grid point has the current effective batch {target} "
            "(per_device_train_batch_size x gradient_accumulation_steps x gpus)"
        )
    plan.notes.append(
        f"--hold-global-batch: {len(kept)} of {len(combos)} combinations keep the effective batch at {target}"
    )
    return kept


def _batch_note(plan: Plan, cfg: ReplayConfig) -> None:
    sizes = sorted({effective_batch(p.params, cfg) for p in plan.points})
    if len(sizes) > 1:
        plan.notes.append(
            f"the effective batch varies across the grid ({sizes[0]} to {sizes[-1]}; "
            f"yours is {plan.global_batch}): "
            "points are compared by speed, not by convergence; scale the learning rate with the batch "
            "(linear rule for SGD-like training, square-root rule for Adam) or pass --hold-global-batch"
        )


def shard(points: list[Point], spec: str | None) -> list[Point]:
    """The points of shard ``I/N`` (0-based, round-robin so shards take similar time)."""
    if spec is None:
        return points
    i, n = parse_shard(spec)
    return [p for p in points if p.index % n == i]


def parse_shard(spec: str) -> tuple[int, int]:
    try:
        i_text, n_text = spec.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise UserError(f"--shard {spec!r}: write it as I/N, e.g. 0/4 (I counts from 0)") from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {spec}: need 0 <= I < N (I counts from 0)")
    return i, n
