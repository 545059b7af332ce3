"""The fixes preflight applies, each the way the report's rules would propose it.

Order matters: precision and padding shrink the GPU's work first, which raises the
data demand the input-pipeline fix must then meet; checkpoints are sized last
against the shortened run. A fix is kept only if it saves time. Every value a fix
sets comes from :mod:`gpudoctor.rules.values`, the functions the report's rules call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpudoctor.common.wording import plural
from gpudoctor.core.schema import PreflightFix
from gpudoctor.replay import costmodel
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.costmodel import Plan, Workload, simulate
from gpudoctor.rules import values

STALL_TOLERANCE = 0.02
PAD_TOLERANCE = 0.25
MIN_GAIN = 0.005  # a fix must save this share of wall time ...
MIN_GAIN_S = 60.0  # ... or this many seconds of the whole run (idle GPUs at each launch add up)

Fix = tuple[Plan, PreflightFix]


def apply_fixes(plan: Plan, w: Workload, config: ReplayConfig) -> tuple[Plan, list[PreflightFix]]:
    """Turn each knob the way the report's rules would, keeping fixes that save time."""
    fixes: list[PreflightFix] = []
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
    fix: PreflightFix
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


def _fix_padding(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    if plan.padding != "max_length":
        return None
    multiple = values.pad_multiple_for(w.length_p50)
    new_len = values.max_length_for(w.length_p99, plan.max_length, multiple=multiple)
    changes: dict[str, Any] = {"max_length": new_len} if new_len else {}
    new = dataclasses.replace(plan, max_length=new_len or plan.max_length)
    pad = float(simulate(new, w)["pad_fraction"])
    if pad > PAD_TOLERANCE:
        if config.text.template is None:
            new = dataclasses.replace(
                new, padding="packing", input_side="pretokenized", max_length=plan.max_length
            )
            changes = {"padding": "packing", "tokenize_at": "ahead"}
        else:
            new = dataclasses.replace(new, padding="longest", pad_multiple=multiple)
            changes.update(padding="longest", pad_to_multiple_of=multiple)
    if not changes:
        return None
    before_pad = float(simulate(plan, w)["pad_fraction"])
    summary = f"padding is {before_pad:.0%} of the tokens the GPU computes on: " + ", ".join(
        f"{k}={v}" for k, v in changes.items()
    )
    if "max_length" in changes:
        cap = changes["max_length"]
        cut = sum(x > cap for x in w.raw_lengths) / len(w.raw_lengths) if w.raw_lengths else None
        summary += (
            f" (p99 of {w.length_basis} rounded up to {multiple}"
            + (f"; truncates {cut:.1%} of the sampled examples" if cut is not None else "")
            + ")"
        )
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
    fix: PreflightFix = {
        "rule": "startup_idle",
        "config": changes,
        "summary": f"{what} of {w.examples:,} examples at startup keeps {plural(w.gpus, 'GPU')} idle for {seconds / 60:.1f} min: "
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
    """Enough workers for the GPU's demand (the rules' headroom), within the free cores per GPU."""
    loader, _ = costmodel.input_costs(plan, w)
    tok = costmodel.tokens(plan, w)
    compute = (
        w.batch_size
        * costmodel.flops_per_sample(tok["padded"], w)
        / (w.gpu.peak_tflops(plan.precision) * 1e12 * w.mfu)
    )
    needed = values.workers_needed(w.batch_size * loader, compute)
    free = w.cores_per_rank - 1  # the training process keeps one core busy
    return dataclasses.replace(plan, workers=max(plan.workers, values.workers_for(needed, free)))


def _fix_checkpoint(plan: Plan, w: Workload, config: ReplayConfig) -> Fix | None:
    fig = simulate(plan, w)
    share = fig["breakdown"]["checkpoint"]
    if not plan.save_steps or share <= values.CHECKPOINT_TARGET:
        return None
    steps = int(fig["optimizer_steps"])
    each_s = float(fig["checkpoint_s_each"])
    every = max(values.save_steps_for(each_s, float(fig["step_s"])), plan.save_steps)
    target = (
        f"to stay under {values.CHECKPOINT_TARGET:.0%}"
        if every <= steps
        else f"(one save alone is {each_s:.0f} s: save at the end, or write faster storage)"
    )
    fix: PreflightFix = {
        "rule": "checkpoint_overhead",
        "config": {"save_steps": every},
        "summary": f"{fig['checkpoint_count']} checkpoints of {each_s:.0f} s take {share:.0%} of the run: "
        f"save every {every} steps {target}",
    }
    return dataclasses.replace(plan, save_steps=every), fix
