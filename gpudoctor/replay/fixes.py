"""The fixes preflight applies, each the way the report's rules would propose it.

Order matters: precision and padding shrink the GPU's work first, which raises the
data demand the input-pipeline fix must then meet; checkpoints are sized last
against the shortened run. A fix is kept only if it saves time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gpudoctor.replay import costmodel
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.costmodel import Plan, Workload, simulate

CHECKPOINT_TARGET_SHARE = 0.02
STALL_TOLERANCE = 0.02
PAD_TOLERANCE = 0.25
MIN_GAIN = 0.005  # a fix must save this share of wall time ...
MIN_GAIN_S = 60.0  # ... or this many seconds of the whole run (idle GPUs at each launch add up)

Fix = tuple[Plan, dict[str, Any]]


def apply_fixes(plan: Plan, w: Workload, config: ReplayConfig) -> tuple[Plan, list[dict[str, Any]]]:
    """Turn each knob the way the report's rules would, keeping fixes that save time."""
    fixes: list[dict[str, Any]] = []
    for step in (_fix_precision, _fix_padding, _fix_startup, _fix_input, _fix_checkpoint):
        candidate = step(plan, w, config)
        if candidate is None:
            continue
        new_plan, fix = candidate
        old_h, new_h = simulate(plan, w)["wall_h"], simulate(new_plan, w)["wall_h"]
        if old_h - new_h > MIN_GAIN * old_h or (old_h - new_h) * 3600 >= MIN_GAIN_S:
            fixes.append({**fix, "saves_h": old_h - new_h})
            plan = new_plan
    return plan, fixes


def _fix_precision(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    if plan.precision in ("bf16", "fp16"):
        return None
    if w.gpu.bf16_tflops is not None:
        fix = {
            "rule": "no_mixed_precision",
            "config": {"bf16": True, "tf32": True},
            "summary": f"train in bf16 (and allow tf32 for what stays fp32): {w.gpu.peak_tflops(plan.precision):g} -> {w.gpu.bf16_tflops:g} TFLOP/s peak",
        }
        return dataclasses.replace(plan, precision="bf16"), fix
    if w.gpu.fp16_tflops is not None:
        fix = {
            "rule": "no_mixed_precision",
            "config": {"fp16": True},
            "summary": f"{w.gpu.name} has no bf16: train in fp16 with loss scaling",
        }
        return dataclasses.replace(plan, precision="fp16"), fix
    return None


def right_sized_length(lengths: tuple[int, ...], max_length: int) -> int:
    """p99 of the real lengths rounded up to a multiple of 64, never above ``max_length``."""
    if not lengths:
        return max_length
    ordered = sorted(lengths)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return min(max_length, 64 * math.ceil(p99 / 64))


def _fix_padding(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    if plan.padding != "max_length":
        return None
    new_len = right_sized_length(w.raw_lengths, plan.max_length)
    new = dataclasses.replace(plan, max_length=new_len)
    changes: dict[str, Any] = {"max_length": new_len} if new_len < plan.max_length else {}
    pad = float(simulate(new, w)["pad_fraction"])
    if pad > PAD_TOLERANCE:
        if config.text.template is None:
            new = dataclasses.replace(
                new, padding="packing", input_side="pretokenized", max_length=plan.max_length
            )
            changes = {"padding": "packing", "tokenize_at": "ahead"}
        else:
            new = dataclasses.replace(new, padding="longest")
            changes["padding"] = "longest"
    if not changes:
        return None
    before_pad = float(simulate(plan, w)["pad_fraction"])
    summary = f"padding is {before_pad:.0%} of the tokens the GPU computes on: " + ", ".join(
        f"{k}={v}" for k, v in changes.items()
    )
    if "max_length" in changes:
        summary += " (p99 of the real lengths rounded up to 64; longer examples are truncated)"
    if changes.get("padding") == "packing":
        summary += " (pre-tokenize and pack examples into max_length chunks)"
    return new, {"rule": "padding_waste", "config": changes, "summary": summary}


def _fix_startup(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    if not (plan.startup_format or plan.startup_tokenize):
        return None
    seconds = float(simulate(plan, w)["startup_s"])
    what = " and ".join(
        x
        for x, on in (("formatting", plan.startup_format), ("tokenization", plan.startup_tokenize))
        if on
    )
    changes = {
        k: "ahead"
        for k, on in (("format_at", plan.startup_format), ("tokenize_at", plan.startup_tokenize))
        if on
    }
    fix = {
        "rule": "startup_idle",
        "config": changes,
        "summary": f"{what} of {w.examples:,} examples at startup keeps {w.gpus} GPU(s) idle for {seconds / 60:.1f} min: "
        "do it once before renting (datasets.map then save_to_disk)",
    }
    return dataclasses.replace(plan, startup_format=False, startup_tokenize=False), fix


def _stall(plan: Plan, w: Workload) -> float:
    return float(simulate(plan, w)["data_stall_share"])


def _fix_input(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    if _stall(plan, w) <= STALL_TOLERANCE:
        return None
    changes: dict[str, Any] = {}
    new = plan
    if w.loop_s_per_sample > 0 and plan.input_side == "configured":
        new = dataclasses.replace(new, input_side="in_loader")
        changes["tokenize_at"] = "getitem"
    new = _with_workers(new, w)
    if _stall(new, w) > STALL_TOLERANCE and new.input_side != "pretokenized":
        new = _with_workers(dataclasses.replace(new, input_side="pretokenized"), w)
        changes["tokenize_at"] = "ahead"
    if new.workers != plan.workers:
        changes["dataloader_num_workers"] = new.workers
    if not changes:
        return None
    rule = "tokenization_in_loop" if "tokenize_at" in changes else "data_stall"
    summary = (
        f"the GPU would wait for data {_stall(plan, w):.0%} of the time: "
        + ", ".join(f"{k}={v}" for k, v in changes.items())
        + f" (measured {1 / max(w.loader_s_per_sample, 1e-9):,.0f} samples/s per process here)"
    )
    return new, {"rule": rule, "config": changes, "summary": summary}


def _with_workers(plan: Plan, w: Workload) -> Plan:
    """Enough workers for the GPU's demand with 25% headroom, within the cores per GPU."""
    loader, _ = costmodel.input_costs(plan, w)
    tok = costmodel.tokens(plan, w)
    compute = (
        w.batch_size
        * costmodel.flops_per_sample(tok["padded"], w)
        / (w.gpu.peak_tflops(plan.precision) * 1e12 * w.mfu)
    )
    needed = math.ceil(1.25 * w.batch_size * loader / max(compute, 1e-12))
    most = max(1, w.cores_per_rank - 1)
    workers = min(max(needed, 2, plan.workers), most) if plan.workers < most else plan.workers
    return dataclasses.replace(plan, workers=workers)


def _fix_checkpoint(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    fig = simulate(plan, w)
    share = fig["breakdown"]["checkpoint"]
    if not plan.save_steps or share <= CHECKPOINT_TARGET_SHARE:
        return None
    budget_s = CHECKPOINT_TARGET_SHARE * (float(fig["train_s"]) + float(fig["startup_s"]))
    saves = max(1, int(budget_s / float(fig["checkpoint_s_each"])))
    steps = int(fig["optimizer_steps"])
    every = _round_up(math.ceil(steps / saves))
    every = max(every, plan.save_steps)
    each_s = float(fig["checkpoint_s_each"])
    target = (
        f"to stay under {CHECKPOINT_TARGET_SHARE:.0%}"
        if each_s <= budget_s
        else f"(one save alone is {each_s:.0f} s: save at the end, or write faster storage)"
    )
    fix = {
        "rule": "checkpoint_overhead",
        "config": {"save_steps": every},
        "summary": f"{fig['checkpoint_count']} checkpoints of {each_s:.0f} s take {share:.0%} of the run: "
        f"save every {every} steps {target}",
    }
    return dataclasses.replace(plan, save_steps=every), fix


def _round_up(n: int) -> int:
    unit = 100 if n >= 100 else 10 if n >= 10 else 1
    return unit * math.ceil(n / unit)
