"""One process's GPU-clock lines (``gpu_step``, ``gpu_wait``) and its loader waits cut to the GPU's idle.

Per process, below the whole-run figures of :mod:`gpudoctor.analysis.gpu_timeline` (which read the
:class:`~gpudoctor.analysis.model.Analysis`): :mod:`gpudoctor.analysis.process` builds each
process's breakdown from these, so the two stay one-way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.analysis import timeline as tl
from gpudoctor.core.events import GpuStepEvent
from gpudoctor.recording.records import Records

# A gpu_step's seconds the training stream sat idle: loader waits, after host syncs, checkpoint
# saves, and waiting for collectives (DDP's all-reduce, FSDP's all-gathers and reduce-scatters).
IDLE_KEYS = ("wait_idle_s", "sync_idle_s", "save_s", "comm_wait_s", "gather_wait_s", "rs_wait_s")


@dataclass
class ClockView:
    """One process's GPU-clock lines."""

    steps: list[GpuStepEvent]
    waits: dict[float, float]  # wait start (host epoch) -> GPU idle seconds inside it
    device: str | None
    saves: list[tuple[float, float, float]] = field(default_factory=list)  # (host t0, host dt, GPU s)

    @property
    def timed(self) -> list[GpuStepEvent]:
        """Steps with a GPU duration (all but the first)."""
        return [s for s in self.steps if isinstance(s["gpu_s"], float)]

    def busy_s(self, step: GpuStepEvent) -> float:
        """GPU seconds of a step less what the events saw it idle (waits, after syncs, the training
        stream waiting for DDP's all-reduce after backward or for FSDP's all-gathers and last
        reduce-scatters) or saving."""
        idle = sum(float(v or 0.0) for v in idle_parts(step))
        return max(0.0, float(step["gpu_s"] or 0.0) - idle)

    def host_steps(self) -> list[HostStep]:
        """Per timed step after the first, the host's period split into its own seconds and the
        seconds it sat blocked on the GPU where the hooks mark it; steps with a save are left out."""
        steps = self.timed
        return [HostStep(float(step["t"]) - float(prev["t"]),
                         float(step.get("sync_block_s") or 0.0) + float(step.get("h2d_block_s") or 0.0),
                         float(step.get("wait_idle_s") or 0.0))
                for prev, step in zip(steps, steps[1:], strict=False)
                if not step.get("saves") and float(step["t"]) > float(prev["t"])]


@dataclass(frozen=True)
class HostStep:
    """One step on the host beside the GPU: its period and its time blocked on the GPU in marked
    calls (syncs, pageable copies); the rest is its own: fetching the batch, launching the step's
    kernels and the Python around them. A GPU step is about the longer of that and its kernels (the
    GPU idles through a fetch once it no longer runs behind the host)."""

    period_s: float
    blocked_s: float
    idle_in_waits_s: float  # the GPU's idle inside the step's loader waits (the data bucket's)

    @property
    def own_s(self) -> float:
        return max(0.0, self.period_s - self.blocked_s)

    @property
    def compute_floor_s(self) -> float:
        """The host's own seconds less what the GPU already idled in its waits: the floor under
        the step's compute (the fetch the GPU ran through shows once the kernels no longer hide it)."""
        return max(0.0, self.own_s - self.idle_in_waits_s)


def idle_parts(step: GpuStepEvent) -> tuple[float | None, ...]:
    """The step's seconds of each of :data:`IDLE_KEYS`, in that order (None: not written)."""
    return (step.get("wait_idle_s"), step.get("sync_idle_s"), step.get("save_s"), step.get("comm_wait_s"),
            step.get("gather_wait_s"), step.get("rs_wait_s"))


def clock_view(records: Records) -> ClockView | None:
    waits = {float(e["t0"]): float(e["idle_s"]) for e in records.gpu_waits}
    saves = sorted((float(e["t0"]), float(e["dt"]), float(e["idle_s"])) for e in records.gpu_saves)
    if not records.gpu_steps and not waits:
        return None
    device = records.gpu_clock.get("device") if records.gpu_clock is not None else None
    return ClockView(sorted(records.gpu_steps, key=lambda s: float(s["t"])), waits, device, saves)


def gpu_wait_intervals(spans: list[tl.Interval], clock: ClockView) -> list[tl.Interval]:
    """Each host wait cut to the part the GPU idled: its last ``idle_s`` (the GPU drains its queue,
    then waits). A wait the events did not cover (before the first CUDA forward) stays whole."""
    out = []
    for a, b in spans:
        idle = clock.waits.get(a)
        out.append((a, b) if idle is None else (max(a, b - idle), b))
    return out


SAVE_MATCH_S = 0.005  # a save mark starts this close to its host span (two clocks read back to back)


def gpu_save_intervals(spans: list[tl.Interval], clock: ClockView) -> list[tl.Interval]:
    """Each checkpoint span less its head the GPU spent finishing the previous step.

    A save's marks give the GPU's part of it (``idle_s``: from the GPU draining its queue to the
    save's end); the host's save is longer by the time the GPU was still busy when it began. That
    head is cut; a tail the host added after the marks (an ``os.fsync``, a rotation) stays, the GPU
    having nothing queued then. A span no mark covers (before the first CUDA forward) stays whole.
    """
    out = []
    for a, b in spans:
        mark = next((m for m in clock.saves if a - SAVE_MATCH_S <= m[0] <= a + SAVE_MATCH_S), None)
        if mark is None:
            out.append((a, b))
            continue
        _, host_dt, gpu_s = mark
        out.append((min(b, a + max(0.0, host_dt - gpu_s)), b))
    return out
