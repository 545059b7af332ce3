"""What data parallelism's collectives cost one process, per optimizer step (``comm`` events).

The hooks (:mod:`gpudoctor.hooks.comm_hooks`) write one ``comm`` event per optimizer step: DDP's
micro-steps and those that all-reduced, gradient buckets, bytes, seconds in flight, the part the
host waited for after backward (exposed; on CUDA the GPU clock's ``comm_wait_s`` on its
``gpu_step`` lines, the training stream's wait for the all-reduce), the unused-parameter search, and direct
``torch.distributed`` calls. This module reduces them to medians per step, leaving out the first
step (DDP rebuilds its buckets after it, and the first step carries the warm-up).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from gpudoctor.analysis.process import ProcessView
from gpudoctor.core.events import DdpEvent, GpuStepEvent

R = TypeVar("R")


@dataclass(frozen=True)
class CommFigures:
    """One process's collectives, per optimizer step (medians over its steady steps)."""

    steps: int  # steps with a ``comm`` event, the first left out when there are more
    micro: float  # DDP training forwards per optimizer step (the accumulation)
    synced: float  # of those, the ones that all-reduced their gradients
    bytes: float  # gradient bytes all-reduced
    comm_s: float  # seconds some gradient bucket was in flight
    exposed_s: float | None  # seconds the training waited for the all-reduce after backward (None: not measured)
    search_s: float  # find_unused_parameters' graph search
    direct: float  # direct torch.distributed calls
    direct_s: float  # host seconds in the blocking ones
    unused_params: int | None  # parameters without a gradient at the first step (None: not looked)
    ddp: DdpEvent | None  # the DDP model's settings (``ddp`` event)
    exposed_clock: str | None = None  # host | gpu: whose clock measured ``exposed_s``
    fsdp: int | None = None  # 1 or 2 (``fully_shard``): FSDP's all-gathers were seen
    gather_bwd: float = 0.0  # all-gathers inside backward (FSDP re-gathering resharded parameters)
    gather_bwd_bytes: float = 0.0
    gather_bwd_s: float = 0.0  # ... seconds the training waited in them (host: gloo; GPU clock: NCCL)
    gather_clock: str | None = None  # host | gpu: whose clock measured ``gather_bwd_s``

    @property
    def per_allreduce_s(self) -> float | None:
        """Exposed seconds of one backward's all-reduce."""
        return self.exposed_s / self.synced if self.exposed_s is not None and self.synced else None

    @property
    def busy_per_allreduce_s(self) -> float | None:
        """Seconds one backward's all-reduce was in flight (hidden or not)."""
        return self.comm_s / self.synced if self.synced else None


def comm_figures(p: ProcessView) -> CommFigures | None:
    """The process's collectives per step; None when it made none (no DDP, no direct call)."""
    rows: list[Mapping[str, Any]] = sorted(p.comm, key=lambda e: float(e.get("t") or 0.0))
    if not rows:
        return None
    unused = next((e["unused_params"] for e in rows if isinstance(e.get("unused_params"), int)), None)
    steady = _steady(rows)

    def med(key: str) -> float:
        return float(statistics.median(float(e.get(key) or 0.0) for e in steady))

    exposed = [float(e["exposed_s"]) for e in steady if isinstance(e.get("exposed_s"), (int, float))]
    clock: str | None = "host"
    if len(exposed) * 2 < len(steady):
        exposed, clock = _gpu_exposed(p), "gpu"
        if not exposed:
            clock = None
    return CommFigures(
        steps=len(steady), micro=med("micro"), synced=med("synced"), bytes=med("bytes"), comm_s=med("comm_s"),
        exposed_s=float(statistics.median(exposed)) if clock is not None else None,
        search_s=med("search_s"), direct=med("direct"), direct_s=med("direct_s"),
        unused_params=unused, ddp=p.ddp, exposed_clock=clock,
        fsdp=next((int(e["fsdp"]) for e in rows if e.get("fsdp")), None), gather_bwd=med("gather_bwd"),
        gather_bwd_bytes=med("gather_bwd_bytes"), **_gather_wait(p, med("gather_bwd_s")))


def _gather_wait(p: ProcessView, host_s: float) -> dict[str, Any]:
    """FSDP's backward all-gathers per step: the host's seconds (gloo blocks it), else the training
    stream's waits for them on the GPU clock (NCCL)."""
    if host_s > 0:
        return {"gather_bwd_s": host_s, "gather_clock": "host"}
    steady = _steady(_gpu_steps(p, "gathers"))
    if not steady:
        return {"gather_bwd_s": host_s, "gather_clock": None}
    return {"gather_bwd_s": float(statistics.median(float(s.get("gather_bwd_wait_s") or 0.0) for s in steady)),
            "gather_clock": "gpu"}


def _steady(rows: list[R]) -> list[R]:
    """Per-step rows less the first (DDP rebuilds its buckets after it; it carries the warm-up)."""
    return rows[1:] if len(rows) > 2 else rows


def _gpu_steps(p: ProcessView, timed: Literal["comms", "gathers"] = "comms") -> list[GpuStepEvent]:
    """The GPU clock's steps, in order, that timed ``timed``: DDP's all-reduce (``comms``) or FSDP's
    all-gathers (``gathers``) on a CUDA run."""
    clock = p.gpu_clock
    return [s for s in clock.steps if s.get(timed)] if clock is not None else []


def _gpu_exposed(p: ProcessView) -> list[float]:
    """Per steady step, the seconds the training stream waited for the all-reduce after backward."""
    steady = _steady(_gpu_steps(p))
    return [float(s.get("comm_wait_s") or 0.0) for s in steady]


def exposed_total_s(p: ProcessView) -> float:
    """All the exposed all-reduce seconds of the run: the host's (CPU, gloo), else the GPU clock's (NCCL)."""
    host = [float(x) for e in p.comm if isinstance(x := e.get("exposed_s"), (int, float))]
    if host:
        return sum(host)
    return sum(float(s.get("comm_wait_s") or 0.0) for s in _gpu_steps(p))


def step_s(p: ProcessView) -> float | None:
    """The median seconds from one optimizer step to the next (None: fewer than 3 steps)."""
    intervals = p.step_intervals_s()
    return float(statistics.median(intervals)) if len(intervals) >= 2 else None
