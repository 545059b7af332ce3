"""Rules that need a GPU: utilization, memory headroom, TF32 and mixed precision.

Without a GPU these rules stay silent: a doctor that invents GPU figures on a
CPU box is worse than none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import Analysis, gpu_timeline
from gpudoctor.core import schema
from gpudoctor.core.thresholds import BUSY_GPU, HEADROOM_BUSY, HEADROOM_MEMORY, percent
from gpudoctor.rules import vocabulary
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.memory import batch_factor_that_fits, fix_memory
from gpudoctor.rules.names import Names, names_for

# Fraction of compute time matmuls could save; deliberately conservative
# (NVIDIA quotes up to 8x for TF32 and 2x more for bf16 on the matmuls alone).
TF32_GAIN = 0.5
BF16_GAIN = 0.5


def gpu_idle_share(a: Analysis) -> float:
    """Share of wall time the GPU sat idle that startup, data wait, saving and eval do not explain.

    That idle time lies inside the compute slice (the host is busy between kernels). On a CUDA
    run with the GPU clock, the idle the events measured after host syncs is ``host_sync``'s
    (a disjoint part) and is left out, and so are the saves' marks (``checkpoint`` is then the
    GPU's part of each save); what remains is NVML's idle that no event explains.
    """
    fig = gpu_timeline.figures(a)
    if fig is not None:
        nvml = a.gpu.busy_in_loop if a.gpu.busy_in_loop is not None else a.gpu.busy_fraction
        if nvml is None:
            return 0.0
        explained = a.share("data_wait") + a.share("checkpoint")
        loop = a.share("compute") + explained
        unexplained = (1.0 - nvml) * loop - explained - fig.sync_idle_s / a.duration_s
        return min(max(0.0, unexplained), a.share("compute"))
    busy = a.gpu.busy_fraction or 0.0
    explained = sum(a.share(k) for k in ("startup", "data_wait", "communication", "checkpoint", "eval"))
    return min(max(0.0, 0.9 - busy - explained), a.share("compute"))


def compute_part(a: Analysis, part: str, fraction: float) -> Claim:
    """A claim on the GPU-idle or GPU-busy part of compute: two disjoint kinds of seconds.

    Fixes of idle time (host overhead, tiny batches) share the idle part; fixes of the
    math (TF32, bf16) share the busy part; within a part they compound.
    """
    compute = a.share("compute")
    idle = gpu_idle_share(a)
    fig = gpu_timeline.figures(a)
    after_syncs = fig.sync_idle_s / a.duration_s if fig is not None else 0.0  # host_sync's part
    part_s = idle if part == "gpu_idle" else max(0.0, compute - idle - after_syncs)
    return Claim("compute", fraction, part, part_s / compute if compute > 0 else 0.0)


def _ampere_or_newer(cfg: Mapping[str, Any]) -> bool:
    cap = cfg.get("device_capability") or [0, 0]
    return bool(cfg.get("cuda")) and cfg.get("device") == "cuda" and cap[0] >= 8


MIN_CLOCK_IDLE = 0.02  # idle no event explains, as a share of wall, before a GPU-clock run hears of it


def gpu_busy(a: Analysis) -> float | None:
    """The GPU's busy share: from the CUDA events when the run has them (busy / GPU step time),
    else NVML's."""
    fig = gpu_timeline.figures(a)
    return fig.busy_fraction if fig is not None else a.gpu.busy_fraction


@dataclass(frozen=True)
class IdleFigures:
    """The GPU's busy share and what the slices explain: worded by ``_word_idle``."""

    busy: float
    clocked: bool  # from the CUDA events (else NVML's)
    busy_in_loop: float | None  # NVML's, during the training loop
    gpus: int
    explained: float  # share of wall time startup, data wait, saving and eval explain


class LowGpuUtilization(Rule):
    name = "low_gpu_utilization"
    fires_when = f"NVML busy < {percent(BUSY_GPU)} beyond what startup, data, saving and eval explain"
    fix_from = 'host syncs, small kernels, `torch_compile`'

    def match(self, a: Analysis) -> Finding | None:
        busy = gpu_busy(a)
        if busy is None or busy >= BUSY_GPU:
            return None
        clocked = gpu_timeline.figures(a) is not None
        if clocked and gpu_idle_share(a) < MIN_CLOCK_IDLE:
            return None  # the GPU clock puts the idle in data waits or after syncs: those findings say so
        explained = sum(a.share(k) for k in ("startup", "data_wait", "communication", "checkpoint", "eval"))
        fig = IdleFigures(busy, clocked, a.gpu.busy_in_loop, a.gpu.count, explained)
        return _word_idle(fig, names_for(a.primary), compute_part(a, "gpu_idle", 1.0))


def _word_idle(fig: IdleFigures, names: Names, idle: Claim) -> Finding:
    return Finding(
        rule=LowGpuUtilization.name,
        title="The GPU is idle much of the time",
        claims=[idle],
        evidence=(
            (f"CUDA events time the GPU busy {pct(fig.busy)} of its step time" if fig.clocked
             else f"NVML reports the {'GPU' if fig.gpus == 1 else 'GPUs'} busy {pct(fig.busy)} of the run")
            + (f" ({'NVML: ' if fig.clocked else ''}{pct(fig.busy_in_loop)} "
               "during the training loop)" if fig.busy_in_loop is not None else "")
            + f"; startup, data wait, saving and eval explain {pct(fig.explained)} of wall time."
        ),
        fix=Fix(
            summary="Look for host-side work between kernels: .item()/.cpu() calls each step, Python-side "
            "metrics, small kernels; larger batches and torch.compile reduce launch overhead.",
            config={"torch_compile": True} if names.has("torch_compile") else {},
            snippet="model = torch.compile(model)",
            library=names.library,
            call=names.call,
        ),
        data={"gpu_busy": round(fig.busy, 4), "explained_share": round(fig.explained, 4)},
    )


@dataclass(frozen=True)
class HeadroomFigures:
    """GPU memory left and the larger batch it fits: worded by ``_word_headroom``."""

    used_mib: float
    total_mib: float
    busy: float
    batch_size: Any  # as the run set it
    factor: int  # the batch × factor fits in the measured headroom
    config: dict[str, object]  # the batch × factor, and accumulation ÷ factor where it was ≥ factor
    memory: schema.FixMemory  # its predicted peak and the headroom left (unavailable: not measured)
    nvml_factor: int | None = None  # what NVML's headroom alone allowed, where the measured peak says otherwise


class _BatchHeadroom(Rule):
    """Peak GPU memory well under half while the GPU is not saturated: a larger batch fits.

    Two names for two situations a user acts on differently: a batch of 1-2 is a choice
    to revisit (``small_batch``), a larger one simply leaves memory unused.
    """

    def applies(self, batch_size: int) -> bool:
        raise NotImplementedError

    def match(self, a: Analysis) -> Finding | None:
        used, total, busy = a.gpu.mem_used_max_mib, a.gpu.mem_total_mib, gpu_busy(a)
        if not used or not total or busy is None or busy >= HEADROOM_BUSY or used / total >= HEADROOM_MEMORY:
            return None
        names = names_for(a.primary)
        bs = names.current("per_device_train_batch_size", "batch_size") or 1
        if not self.applies(int(bs)):
            return None
        nvml_factor = 2 ** max(1, int(math.log2(0.8 * total / used)))
        factor, mem = batch_factor_that_fits(a, nvml_factor)
        if factor < 2 and mem is not None:
            return _word_no_room(self.name, fix_memory(a, mem, 2), bs)
        accum = vocabulary.current_accumulation(names)
        config: dict[str, object] = {names.loader_key("per_device_train_batch_size", "batch_size"): int(bs) * factor}
        if isinstance(accum, int) and accum >= factor:
            config["gradient_accumulation_steps"] = accum // factor
        idle = gpu_idle_share(a)
        if idle <= 0 and gpu_timeline.figures(a) is not None:
            return None  # every idle second is in a wait or after a sync: a larger batch gives none back
        # Larger batches amortize launch overhead: about half of the idle time below HEADROOM_BUSY.
        fraction = min(1.0, max(0.0, (HEADROOM_BUSY - busy) * 0.5) / idle) if idle > 0 else 0.0
        fig = HeadroomFigures(used, total, busy, bs, factor, config, fix_memory(a, mem, factor),
                              nvml_factor if factor != nvml_factor else None)
        return _word_headroom(self.name, fig, names, compute_part(a, "gpu_idle", fraction))


def _word_headroom(rule: str, fig: HeadroomFigures, names: Names, idle: Claim) -> Finding:
    said = vocabulary.batch_fix(names, fig.config)
    return Finding(
        rule=rule,
        title="Batches are small for this GPU",
        claims=[idle],
        evidence=(
            f"Peak GPU memory {fig.used_mib:.0f} of {fig.total_mib:.0f} MiB ({pct(fig.used_mib / fig.total_mib)}) "
            f"with batch size {fig.batch_size} while the GPU was busy {pct(fig.busy)}."
            + (f" NVML's headroom alone suggests {fig.nvml_factor}x (as if all of that memory grew with the batch); "
               f"the peak predicted from the activations measured per sample allows {fig.factor}x."
               if fig.nvml_factor else "")
        ),
        fix=Fix(
            summary=f"Raise the per-device batch {fig.factor}x"
            + (" and lower accumulation to keep the global batch" if "gradient_accumulation_steps" in fig.config else
               " (the global batch changes: scale the learning rate with it)")
            + ".",
            config=said.config,
            snippet=said.snippet or None,
            library=said.library,
            call=said.call,
            also=said.also,
            memory=fig.memory,
        ),
        data={"mem_used_mib": fig.used_mib, "mem_total_mib": fig.total_mib, "batch_size": fig.batch_size},
    )


def _word_no_room(rule: str, memory: schema.FixMemory, batch_size: Any) -> Finding:
    """NVML's peak looked low, but the allocator's measured peak says a batch × 2 would not fit:
    said, with no batch prescribed (no claims)."""
    return Finding(
        rule=rule,
        title="A larger batch would not fit in GPU memory",
        evidence=(f"NVML's peak looks low, but batch size {batch_size} × 2 would peak at about "
                  f"{memory['predicted_peak_mib'] or 0:,.0f} MiB, over the {memory['limit_mib'] or 0:,.0f} MiB "
                  "a fix may use: the memory between them is the allocator's, for this batch's activations."),
        fix=Fix(summary="Keep the batch size: no larger one is prescribed. To train larger batches, free memory "
                "first (gradient checkpointing, bf16 autocast) and measure again.", memory=memory),
        severity="info",
        data={"batch_size": batch_size},
    )
_BATCH_FIX_FROM = ('batch × k (k: the largest power of two whose peak, predicted from the activations measured '
                   "per sample on CUDA, stays under 90% of the device, none when × 2 would not; else from NVML's "
                   'memory headroom), accumulation ÷ k to keep the global batch')


class SmallBatch(_BatchHeadroom):
    name = "small_batch"
    fires_when = f"a batch of 1-2 per device, peak GPU memory < {percent(HEADROOM_MEMORY)} and busy < {percent(HEADROOM_BUSY)}"
    fix_from = _BATCH_FIX_FROM

    def applies(self, batch_size: int) -> bool:
        return batch_size <= 2


class GpuMemoryUnderused(_BatchHeadroom):
    name = "gpu_memory_underused"
    fires_when = f"a larger batch, peak GPU memory < {percent(HEADROOM_MEMORY)} and busy < {percent(HEADROOM_BUSY)}"
    fix_from = _BATCH_FIX_FROM

    def applies(self, batch_size: int) -> bool:
        return batch_size > 2


@dataclass(frozen=True)
class MathFigures:
    """The recorded torch settings a precision rule fired on: worded by ``_word_tf32``/``_word_bf16``."""

    device_name: Any
    capability: str  # "80" for sm_80
    matmul_precision: Any
    param_dtype: Any

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> MathFigures:
        return cls(cfg.get("device_name"), "".join(map(str, cfg.get("device_capability") or [])),
                   cfg.get("matmul_precision"), cfg.get("param_dtype"))


class NoTf32(Rule):
    name = "no_tf32"
    fires_when = 'FP32 matmuls without TF32 on an Ampere-or-newer GPU'
    fix_from = '`tf32=True` or `torch.backends.cuda.matmul.allow_tf32 = True`'

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        cfg = p.torch_cfg if p else None
        if not cfg or not _ampere_or_newer(cfg) or cfg.get("autocast"):
            return None
        if cfg.get("allow_tf32") or cfg.get("matmul_precision") != "highest" or cfg.get("param_dtype") != "torch.float32":
            return None
        return _word_tf32(MathFigures.of(cfg), names_for(p), compute_part(a, "gpu_busy", TF32_GAIN))


def _word_tf32(fig: MathFigures, names: Names, busy: Claim) -> Finding:
    return Finding(
        rule=NoTf32.name,
        title="TF32 is off for FP32 matmuls",
        claims=[busy],
        evidence=f"{fig.device_name} (sm_{fig.capability}) runs FP32 "
        "matmuls with torch.get_float32_matmul_precision() == 'highest' and allow_tf32 off.",
        fix=Fix(
            summary="Allow TF32 tensor cores for FP32 matmuls.",
            config={"tf32": True} if names.has("tf32") else {},
            snippet="torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
            library=names.library,
            call=names.call,
        ),
        data={"matmul_precision": fig.matmul_precision},
    )


class NoMixedPrecision(Rule):
    name = "no_mixed_precision"
    fires_when = 'FP32 training without autocast on an Ampere-or-newer GPU'
    fix_from = "`bf16=True` or `torch.autocast('cuda', dtype=torch.bfloat16)`"

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        cfg = p.torch_cfg if p else None
        if not cfg or not _ampere_or_newer(cfg) or cfg.get("autocast") or cfg.get("param_dtype") != "torch.float32":
            return None
        return _word_bf16(MathFigures.of(cfg), names_for(p), compute_part(a, "gpu_busy", BF16_GAIN))


def _word_bf16(fig: MathFigures, names: Names, busy: Claim) -> Finding:
    said = vocabulary.mixed_precision_fix(names)
    return Finding(
        rule=NoMixedPrecision.name,
        title="Training in FP32 without autocast",
        claims=[busy],
        evidence=f"Parameters are float32 and autocast was off at the first training forward on {fig.device_name}.",
        fix=Fix(
            summary="Train with bf16 autocast.",
            config=said.config,
            snippet=said.snippet,
            library=said.library,
            call=said.call,
        ),
        data={"param_dtype": fig.param_dtype},
    )
