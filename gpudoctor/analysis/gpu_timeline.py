"""The GPU's timeline from its own clock (CUDA events), NVML beside it, and MFU.

On a CUDA run the hooks write ``gpu_wait`` and ``gpu_step`` lines (see
:mod:`gpudoctor.hooks.device_clock`). From them a process's breakdown is rebuilt on
the GPU's seconds (:func:`gpudoctor.analysis.gpu_clock.gpu_wait_intervals`): ``data_wait`` is the part of each loader
wait the GPU sat idle, ``compute`` the rest of the loop; the host's own figures stay
beside them (``ProcessView.host_breakdown``). Without those lines nothing changes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudoctor.analysis import workload
from gpudoctor.common import hardware
from gpudoctor.core import schema

if TYPE_CHECKING:
    from gpudoctor.analysis.model import Analysis

# How far NVML's busy share may sit from the events' before the report says they disagree:
# NVML reports whole percents over its own sample period (1/6 to 1 s), and counts a period
# with any kernel of any process as busy; 10 points plus the window's sampling spread.
NVML_TOLERANCE = 0.10
WINDOW_S = 10.0
# The host's own time a step is a launch floor only where it was seen blocking on the GPU: a GPU
# this busy whose host blocked under this share of a step in marked calls (syncs, pageable copies)
# blocked in a full launch queue instead, and its own time is then unknown.
KERNEL_BOUND_BUSY = 0.95
MIN_BLOCKED_SHARE = 0.05
# MFU a well-tuned dense transformer reaches at this precision (of the datasheet peak for it).
REACHABLE_MFU = {"bf16": 0.45, "fp16": 0.45, "tf32": 0.40, "fp32": 0.60}


# AdamW's memory traffic per parameter (fp32 p, g, m, v), as the replay's cost model streams it:
# fused (one kernel: read p, g, m, v; write p, m, v) and torch's default on CUDA, foreach (one pass
# per op: weight decay 8, lerp of m 12, v *= b2 8, v += g*g 12, sqrt 8, / bias 8, + eps 8, p -= m/d 16).
ADAMW_FUSED_BYTES_PER_PARAM = workload.ADAMW_BYTES_PER_PARAM
ADAMW_FOREACH_BYTES_PER_PARAM = 80


def optimizer_step_s(params: float, bandwidth_gb_s: float,
                     bytes_per_param: float = ADAMW_FUSED_BYTES_PER_PARAM) -> float:
    """An AdamW step: bytes streamed per parameter at the cost model's share of the bandwidth."""
    return float(params * bytes_per_param / (bandwidth_gb_s * 1e9 * workload.BANDWIDTH_EFFICIENCY))


def shape_of(model: Mapping[str, Any]) -> workload.Shape:
    """The model's shape as the workload model reads it; from the parameter count alone when the
    recording has neither a parameter walk nor a config with the sizes."""
    shape = workload.shape_from_model_event(model)
    if shape is not None:
        return shape
    layers, hidden = workload.infer_shape(float(model["params"]))
    return workload.Shape(float(model["params"]), layers, hidden, True, "guessed from the parameter count")


@dataclass
class Mfu:
    value: float | None
    reason: str | None
    inputs: dict[str, Any]

    def to_dict(self) -> schema.MfuSection:
        return {"value": None if self.value is None else round(self.value, 4), "reason": self.reason,
                "inputs": self.inputs}


def precision_of(cfg: Mapping[str, Any] | None) -> str:
    """bf16 | fp16 | tf32 | fp32: what the matmuls ran in, from the recorded torch settings."""
    cfg = cfg or {}
    dtype = str(cfg.get("autocast_dtype") if cfg.get("autocast") else cfg.get("param_dtype") or "")
    if "bfloat16" in dtype:
        return "bf16"
    if "float16" in dtype:
        return "fp16"
    if cfg.get("allow_tf32") or cfg.get("matmul_precision") in ("high", "medium"):
        return "tf32"
    return "fp32"


def mfu(a: Analysis) -> Mfu:
    """Model FLOPs per step ÷ GPU seconds per step ÷ the datasheet peak for the precision in use."""
    p = a.primary
    clock = p.gpu_clock if p is not None else None
    if p is None or clock is None:
        return Mfu(None, "no CUDA events recorded (a CPU run, or a recording from before the GPU clock): MFU needs the GPU's own step time", {})
    inputs: dict[str, Any] = {}
    timed = clock.timed
    if not timed:
        return Mfu(None, "no step was timed on the GPU", inputs)
    gpu_step_s = statistics.median(float(s["gpu_s"] or 0.0) for s in timed)
    cfg: Mapping[str, Any] = p.torch_cfg or {}
    precision = precision_of(cfg)
    name = cfg.get("device_name") or (a.gpu.names[0] if a.gpu.names else None)
    spec = hardware.find(name)
    inputs.update({"gpu_step_s": round(gpu_step_s, 6), "precision": precision, "device_name": name})
    if spec is None:
        return Mfu(None, f"GPU {name!r} is not in the datasheet table (common/hardware.py)", inputs)
    model = p.model
    if model is None or not model.get("params"):
        return Mfu(None, "no model size recorded (a model without config.to_dict())", inputs)
    params = float(model["params"] or 0)
    shape = shape_of(model)
    batches = [b for b in p.batches if b.get("tokens")]
    if not batches or not p.step_times:
        return Mfu(None, "no tokens counted (batches are not dicts of 2-D token tensors)", inputs)
    tokens_per_batch = statistics.fmean(int(b["tokens"]) for b in batches)
    seq_len = statistics.fmean(int(b["seq_len"]) for b in batches)
    batches_per_step = max(1.0, p.n_data_waits / max(len(p.step_times), 1))
    tokens_per_step = tokens_per_batch * batches_per_step
    flops_step = tokens_per_step * workload.flops_per_token(shape, seq_len)
    peak = spec.peak_tflops(precision) * 1e12
    inputs.update({"params": int(params), "matmul_params": int(shape.params), "n_layers": shape.n_layers,
                   "hidden_size": shape.hidden, "shape_source": shape.source, "seq_len": round(seq_len, 1),
                   "tokens_per_step": round(tokens_per_step, 1), "flops_per_step": flops_step,
                   "peak_tflops": spec.peak_tflops(precision), "gpu": spec.key,
                   "bandwidth_gb_s": spec.bandwidth_gb_s,
                   "reachable_mfu": REACHABLE_MFU[precision]})
    return Mfu(flops_step / gpu_step_s / peak, None, inputs)


@dataclass
class GpuFigures:
    """What the GPU clock says about the run's lead process, per step and in total."""

    steps_timed: int
    gpu_step_s: float  # median GPU seconds per step
    busy_fraction: float  # GPU busy / GPU time over the timed steps
    wait_idle_s: float  # GPU idle inside loader waits (all steps)
    host_wait_s: float  # the host's own data wait, for comparison
    syncs_per_step: float
    sync_block_s: float
    sync_idle_s: float  # at most: GPU idle after host syncs
    h2d_s_per_step: float
    gpu_s: float  # total GPU seconds over the timed steps
    host_breakdown: dict[str, float]
    host_own_s: float | None = None  # median host seconds a step not blocked on the GPU (fetch, launches, Python)
    host_blocked_s: float | None = None  # median host seconds a step blocked on the GPU (syncs, copies)
    host_floor_s: float | None = None  # median host_own_s less the GPU's idle in the step's waits

    @property
    def host_bound(self) -> float | None:
        """The host's own seconds a step (less the GPU's idle in its waits, which the data bucket
        holds), where they are a floor the step's compute cannot go under; None where the host
        never blocked in a marked call while the GPU was busy: then it blocked where the hooks do
        not see (a full launch queue) and its own time is not known."""
        if self.host_floor_s is None or self.host_blocked_s is None:
            return None
        if self.busy_fraction >= KERNEL_BOUND_BUSY and self.host_blocked_s < MIN_BLOCKED_SHARE * self.gpu_step_s:
            return None
        return self.host_floor_s


def figures(a: Analysis) -> GpuFigures | None:
    """The lead process's GPU-clock figures; None on a run without them (CPU, or no CUDA forward)."""
    if "gpu_figures" not in a._cache:
        a._cache["gpu_figures"] = _figures(a)
    return a._cache["gpu_figures"]  # type: ignore[no-any-return]


def _figures(a: Analysis) -> GpuFigures | None:
    p = a.primary
    clock = p.gpu_clock if p is not None else None
    if p is None or clock is None or not clock.timed:
        return None
    timed = clock.timed
    gpu_s = sum(float(s["gpu_s"] or 0.0) for s in timed)
    n = len(timed)
    host = clock.host_steps()
    return GpuFigures(
        steps_timed=n,
        gpu_step_s=statistics.median(float(s["gpu_s"] or 0.0) for s in timed),
        busy_fraction=sum(clock.busy_s(s) for s in timed) / gpu_s if gpu_s > 0 else 0.0,
        wait_idle_s=p.seconds("data_wait"),
        host_wait_s=p.host_slice_s.get("data_wait", 0.0),
        syncs_per_step=sum(int(s.get("syncs") or 0) for s in timed) / n,
        sync_block_s=sum(float(s.get("sync_block_s") or 0.0) for s in timed),
        sync_idle_s=sum(float(s.get("sync_idle_s") or 0.0) for s in timed),
        h2d_s_per_step=sum(float(s.get("h2d_s") or 0.0) for s in timed) / n,
        gpu_s=gpu_s,
        host_breakdown=dict(p.host_breakdown),
        host_own_s=statistics.median(h.own_s for h in host) if host else None,
        host_blocked_s=statistics.median(h.blocked_s for h in host) if host else None,
        host_floor_s=statistics.median(h.compute_floor_s for h in host) if host else None,
    )


def nvml_check(a: Analysis) -> list[schema.NvmlWindow]:
    """Per window of ``WINDOW_S``: the events' busy share beside NVML's, and whether they agree."""
    p = a.primary
    clock = p.gpu_clock if p is not None else None
    if clock is None or not a.rec.gpu:
        return []
    out: list[schema.NvmlWindow] = []
    timed = clock.timed
    if not timed:
        return []
    lo = float(timed[0]["t"])
    hi = float(timed[-1]["t"])
    k = 0
    while lo + k * WINDOW_S < hi or k == 0:
        w0, w1 = lo + k * WINDOW_S, min(hi, lo + (k + 1) * WINDOW_S)
        k += 1
        steps = [s for s in timed if w0 < float(s["t"]) <= w1 or (k == 1 and float(s["t"]) == w0)]
        utils = [u for r in a.rec.gpu if w0 <= r.get("t", 0) <= w1 for u in _utils(r)]
        gpu_s = sum(float(s["gpu_s"] or 0.0) for s in steps)
        if not steps or not utils or gpu_s <= 0:
            continue
        events_busy = sum(clock.busy_s(s) for s in steps) / gpu_s
        nvml = statistics.fmean(utils)
        spread = statistics.pstdev(utils) / math.sqrt(len(utils)) if len(utils) > 1 else 0.0
        tolerance = NVML_TOLERANCE + 2 * spread
        out.append({"t_s": round(w0 - a.start, 3), "duration_s": round(w1 - w0, 3), "steps": len(steps),
                    "events_busy": round(events_busy, 4), "nvml_busy": round(nvml, 4),
                    "tolerance": round(tolerance, 4), "agree": abs(events_busy - nvml) <= tolerance})
    return out


def _utils(row: dict[str, Any]) -> list[float]:
    return [float(g["util_pct"]) / 100.0 for g in row.get("gpus", [])
            if g.get("util_pct") is not None and not g.get("lost")]


def nvml_verdict(windows: list[schema.NvmlWindow]) -> str | None:
    """One sentence when NVML and the events disagree, saying which one the report trusts."""
    off = [w for w in windows if not w["agree"]]
    if not off:
        return None
    worst = max(off, key=lambda w: abs(w["events_busy"] - w["nvml_busy"]))
    return (f"NVML and the CUDA events disagree in {len(off)} of {len(windows)} windows (worst: NVML "
            f"{100 * worst['nvml_busy']:.0f}% busy, events {100 * worst['events_busy']:.0f}%, beyond "
            f"±{100 * worst['tolerance']:.0f} points of sampling error); the report trusts the CUDA events, "
            "timed on the GPU on the training's own stream (NVML counts any kernel of any process, "
            "and a period with one short kernel as busy).")
