"""Rules that need the GPU's own clock (CUDA events): host syncs and low MFU.

Both stay silent on a run without ``gpu_step`` lines (a CPU run, or one recorded before the
GPU clock existed): their figures are never guessed from the host's clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import Analysis, gpu_timeline
from gpudoctor.core.thresholds import BUSY_GPU, WASTE_SHARE, percent
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.gpu import BF16_GAIN
from gpudoctor.rules.memory import batch_factor_that_fits
from gpudoctor.rules.names import Names, names_for

LOW_MFU_OF_REACHABLE = 0.5  # MFU under half of what the precision reaches on a busy GPU
SYNC_SNIPPET = (
    "running = torch.zeros((), device='cuda')\n"
    "for step, batch in enumerate(loader):\n"
    "    loss = model(**batch).loss\n"
    "    running += loss.detach()          # stays on the GPU: no sync\n"
    "    ...\n"
    "    if step % 100 == 0:\n"
    "        print(running.item() / 100)   # one sync per 100 steps\n"
    "        running.zero_()"
)


@dataclass(frozen=True)
class SyncFigures:
    """The GPU idle after host syncs, per step, and the GPU step without it: worded by ``_word_sync``."""

    clock: gpu_timeline.GpuFigures
    share: float  # GPU idle after syncs, of wall time
    idle_s_per_step: float
    after_s: float  # the GPU step without that idle
    logging_steps: int | None  # a Trainer logging more often than every 100 steps: 100


class HostSync(Rule):
    name = "host_sync"
    fires_when = (f"CUDA events see the GPU idle ≥ {percent(WASTE_SHARE)} of wall after per-step host syncs "
                  "(`.item()`, `.cpu()`, `cuda.synchronize`)")
    fix_from = "the GPU idle the events measured after each sync (at most the host's time to its next mark): keep values on the GPU, read them every N steps"

    def match(self, a: Analysis) -> Finding | None:
        fig = gpu_timeline.figures(a)
        if fig is None or fig.syncs_per_step <= 0 or a.primary is None:
            return None
        share = fig.sync_idle_s / a.duration_s
        if share < WASTE_SHARE:
            return None
        per_step_idle = fig.sync_idle_s / fig.steps_timed
        names = names_for(a.primary)
        logging = names.current("logging_steps")
        fewer_logs = 100 if names.is_trainer and isinstance(logging, (int, float)) and 0 < logging < 100 else None
        sync = SyncFigures(fig, share, per_step_idle, max(1e-9, fig.gpu_step_s - per_step_idle), fewer_logs)
        idle = claim("compute", fig.sync_idle_s, a.primary.seconds("compute"), part="sync_idle", part_s=fig.sync_idle_s)
        return _word_sync(sync, names, idle)


def _word_sync(fig: SyncFigures, names: Names, idle: Claim) -> Finding:
    c = fig.clock
    config: dict[str, object] = {"logging_steps": fig.logging_steps} if fig.logging_steps else {}
    return Finding(
        rule=HostSync.name,
        title="Host syncs leave the GPU idle every step",
        claims=[idle],
        evidence=(
            f"{c.syncs_per_step:.1f} host syncs per step (.item(), .cpu(), .tolist(), cuda.synchronize); "
            f"the host blocked {1000 * c.sync_block_s / c.steps_timed:.1f} ms per step in them, and the "
            f"CUDA events see the GPU idle up to {1000 * fig.idle_s_per_step:.1f} ms per step after them "
            f"({pct(fig.share)} of wall) while Python ran before queuing more work."
        ),
        fix=Fix(
            summary=f"Keep per-step values on the GPU and read them every N steps: the host then queues the "
            f"next kernels while the GPU runs, and a GPU step of {1000 * c.gpu_step_s:.0f} ms becomes about "
            f"{1000 * fig.after_s:.0f} ms.",
            config=config,
            snippet=SYNC_SNIPPET,
            library=names.library,
            call=names.call if config else None,
        ),
        data={"syncs_per_step": round(c.syncs_per_step, 3),
              "sync_block_ms_per_step": round(1000 * c.sync_block_s / c.steps_timed, 3),
              "sync_idle_ms_per_step": round(1000 * fig.idle_s_per_step, 3),
              "gpu_step_ms": round(1000 * c.gpu_step_s, 3),
              "predicted_gpu_step_ms": round(1000 * fig.after_s, 3)},
    )


@dataclass(frozen=True)
class Lever:
    """One fix of ``low_mfu`` and the share of the GPU's busy time per token it removes: ``gain``
    when the workload model predicts one value, else the range ``low``-``high`` and its basis."""

    what: str
    gain: float | None
    low: float = 0.0
    high: float = 0.0
    basis: str = ""

    def line(self) -> str:
        if self.gain is not None:
            return f"{self.what}: GPU time per token -{100 * self.gain:.0f}%" + (f" ({self.basis})" if self.basis else "")
        low = f"-{100 * self.low:.0f}%" if self.low > 0 else "0"
        return f"{self.what}: GPU time per token {low} to -{100 * self.high:.0f}% ({self.basis})"

    def to_dict(self) -> dict[str, object]:
        return {"lever": self.what, "busy_per_token_removed": None if self.gain is None else round(self.gain, 4),
                "range": None if self.gain is not None else [round(self.low, 4), round(self.high, 4)],
                "basis": self.basis}


@dataclass(frozen=True)
class MfuFigures:
    """MFU against what the precision reaches, and the levers that raise it: worded by ``_word_mfu``."""

    mfu: float
    inputs: dict[str, Any]  # gpu_timeline.mfu's: FLOPs and tokens per step, params, peak, GPU
    precision: str
    reachable: float
    gpu_step_s: float
    busy_fraction: float
    optimizer_step_s: float
    levers: list[Lever]
    config: dict[str, object]  # the levers' values the run's own call takes


class LowMfu(Rule):
    name = "low_mfu"
    fires_when = f"the GPU is busy ≥ {percent(BUSY_GPU)} (CUDA events) and MFU is under half of what its precision reaches"
    fix_from = ("MFU = model FLOPs per step (workload model) ÷ GPU step time ÷ datasheet peak; bf16 as "
                "`no_mixed_precision`; a batch × k (memory headroom) saves the optimizer step per token; a fused "
                "AdamW streams 28 bytes per parameter where torch's foreach one streams 80 (parameters × bytes ÷ "
                "bandwidth); torch.compile: a range from 0 to what the reachable MFU leaves")

    def match(self, a: Analysis) -> Finding | None:
        fig = gpu_timeline.figures(a)
        m = gpu_timeline.mfu(a)
        if fig is None or m.value is None or fig.busy_fraction < BUSY_GPU or a.primary is None:
            return None
        precision = str(m.inputs["precision"])
        reachable = gpu_timeline.REACHABLE_MFU[precision]
        if m.value >= LOW_MFU_OF_REACHABLE * reachable:
            return None
        names = names_for(a.primary)
        busy_s = fig.busy_fraction * fig.gpu_step_s
        params, bandwidth = float(m.inputs["params"]), float(m.inputs["bandwidth_gb_s"])
        ceiling = max(0.0, 1.0 - m.value / reachable)  # busy time per token above the reachable MFU
        levers, config = _levers(precision, names, _batch_factor(a), params, bandwidth, busy_s, ceiling)
        gain = _compound(lv.gain or 0.0 for lv in levers)  # the levers the model predicts, together
        best = min(ceiling, _compound(lv.gain if lv.gain is not None else lv.high for lv in levers))
        claims = [Claim("compute", gain, "gpu_busy", _busy_part(a, fig), up_to=max(gain, best))]
        mfu = MfuFigures(m.value, m.inputs, precision, reachable, fig.gpu_step_s, fig.busy_fraction,
                         gpu_timeline.optimizer_step_s(params, bandwidth), levers, config)
        return _word_mfu(mfu, names, claims)


def _word_mfu(fig: MfuFigures, names: Names, claims: list[Claim]) -> Finding:
    i = fig.inputs
    return Finding(
        rule=LowMfu.name,
        title="The GPU is busy but slow: low MFU",
        claims=claims,
        evidence=(
            f"MFU {pct(fig.mfu)}: {i['flops_per_step'] / 1e12:.2f} TFLOP per step "
            f"({i['tokens_per_step']:.0f} tokens × {i['params'] / 1e6:.0f}M params) in "
            f"{1000 * fig.gpu_step_s:.0f} ms of GPU time against {i['peak_tflops']:.0f} TFLOP/s "
            f"{fig.precision} peak on {i['gpu']}; the GPU was busy {pct(fig.busy_fraction)} of its step time, "
            f"and a tuned run reaches about {pct(fig.reachable)}."
        ),
        fix=Fix(
            summary="Raise the work per kernel: " + "; ".join(lv.line() for lv in fig.levers) + ".",
            config=fig.config,
            snippet="torch.backends.cuda.matmul.allow_tf32 = True\nmodel = torch.compile(model)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
            library=names.library,
            call=names.call if fig.config else None,
        ),
        data={"mfu": round(fig.mfu, 4), "reachable_mfu": fig.reachable, "precision": fig.precision,
              "optimizer_step_ms": round(1000 * fig.optimizer_step_s, 3),
              "levers": [lv.to_dict() for lv in fig.levers]},
    )


def _compound(gains: Iterable[float]) -> float:
    """Gains on the same busy seconds compound: 1 - Π(1 - g)."""
    left = 1.0
    for g in gains:
        left *= 1.0 - min(1.0, max(0.0, g))
    return 1.0 - left


def _busy_part(a: Analysis, fig: gpu_timeline.GpuFigures) -> float:
    """The GPU-busy share of the compute bucket, by the events."""
    compute = a.share("compute")
    busy_share = fig.busy_fraction * fig.gpu_s / a.duration_s
    return min(1.0, busy_share / compute) if compute > 0 else 0.0


def _batch_factor(a: Analysis) -> int | None:
    """How many times the batch fits in the measured GPU memory headroom (as ``small_batch``):
    capped by the peak predicted from the activations measured per sample, None when × 2 would not fit."""
    used, total = a.gpu.mem_used_max_mib, a.gpu.mem_total_mib
    if not used or not total or used / total >= 0.5:
        return None
    factor, _ = batch_factor_that_fits(a, int(2 ** max(1, int(math.log2(0.8 * total / used)))))
    return factor if factor >= 2 else None


def _levers(precision: str, names: Names, factor: int | None, params: float, bandwidth: float,
            busy_s: float, ceiling: float) -> tuple[list[Lever], dict[str, object]]:
    """The fixes, each with the share of the GPU's busy time per token it removes, and the config.

    Precision: the gains ``no_tf32``/``no_mixed_precision`` use. A batch ``factor`` times larger:
    the optimizer step (bytes per parameter over bandwidth) is paid once per step, so per token it
    shrinks by ``1 - 1/factor``; the token work itself does not. A fused AdamW: the same step at 28
    bytes per parameter instead of the 80 of torch's default on CUDA (foreach), one value when the
    run's optimizer is known not fused (a Trainer's ``optim``), else 0 to that (it may be fused
    already). torch.compile fuses the kernels between the matmuls; how much of the busy time they
    take is not measured here, so its range runs from 0 to what the reachable MFU leaves.
    """
    levers: list[Lever] = []
    config: dict[str, object] = {}
    fused_s = gpu_timeline.optimizer_step_s(params, bandwidth)
    if precision in ("fp32", "tf32"):
        levers.append(Lever("bf16 autocast (as no_mixed_precision)", BF16_GAIN))
        if names.has("bf16"):
            config["bf16"] = True
    if factor is not None and busy_s > 0:
        levers.append(Lever(f"a {factor}x batch (memory headroom)", min(1.0, fused_s * (1 - 1 / factor) / busy_s),
                            basis="the optimizer step, paid once per step"))
        key = names.loader_key("per_device_train_batch_size", "batch_size")
        bs = names.current("per_device_train_batch_size", "batch_size")
        if isinstance(bs, int) and bs > 0:
            config[key] = bs * factor
    else:
        levers.append(Lever("a larger batch", None, basis="no GPU memory headroom measured"))
    if busy_s > 0:
        foreach_s = gpu_timeline.optimizer_step_s(params, bandwidth, gpu_timeline.ADAMW_FOREACH_BYTES_PER_PARAM)
        saved = min(1.0, (foreach_s - fused_s) / busy_s)
        traffic = (f"{params / 1e6:.0f}M params × {gpu_timeline.ADAMW_FOREACH_BYTES_PER_PARAM} -> "
                   f"{gpu_timeline.ADAMW_FUSED_BYTES_PER_PARAM} bytes at {bandwidth:.0f} GB/s: "
                   f"{1000 * foreach_s:.1f} -> {1000 * fused_s:.1f} ms per step")
        optim = names.current("optim") if names.is_trainer else None
        if isinstance(optim, str) and "fused" in optim:
            pass  # fused already: nothing to promise
        elif isinstance(optim, str) and optim in ("adamw_torch", "adamw_hf"):
            levers.append(Lever("a fused AdamW (optim=adamw_torch_fused)", saved, basis=traffic))
            config["optim"] = "adamw_torch_fused"
        else:
            levers.append(Lever("a fused AdamW (fused=True)", None, 0.0, saved,
                                f"{traffic}; 0 if it is fused already: the recording does not say"))
    levers.append(Lever("torch.compile", None, 0.0, ceiling,
                        "it fuses the kernels between the matmuls, whose share of the busy time is not measured; "
                        "at most what the reachable MFU leaves"))
    return levers, config
