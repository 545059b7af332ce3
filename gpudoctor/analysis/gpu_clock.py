"""One process's GPU-clock lines (``gpu_step``, ``gpu_wait``) and its loader waits cut to the GPU's idle.

Per process, below the whole-run figures of :mod:`gpudoctor.analysis.gpu_timeline` (which read the
:class:`~gpudoctor.analysis.model.Analysis`): :mod:`gpudoctor.analysis.process` builds each
process's breakdown from these, so the two stay one-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import timeline as tl


@dataclass
class ClockView:
    """One process's GPU-clock lines."""

    steps: list[dict[str, Any]]
    waits: dict[float, float]  # wait start (host epoch) -> GPU idle seconds inside it
    device: str | None

    @property
    def timed(self) -> list[dict[str, Any]]:
        """Steps with a GPU duration (all but the first)."""
        return [s for s in self.steps if isinstance(s.get("gpu_s"), float)]

    def busy_s(self, step: dict[str, Any]) -> float:
        """GPU seconds of a step less what the events saw it idle (waits, after syncs)."""
        return max(0.0, float(step["gpu_s"]) - float(step.get("wait_idle_s") or 0.0)
                   - float(step.get("sync_idle_s") or 0.0))


def clock_view(events: list[dict[str, Any]]) -> ClockView | None:
    steps = [e for e in events if e.get("k") == "gpu_step"]
    waits = {float(e["t0"]): float(e["idle_s"]) for e in events if e.get("k") == "gpu_wait"}
    if not steps and not waits:
        return None
    device = next((e.get("device") for e in events if e.get("k") == "gpu_clock"), None)
    return ClockView(sorted(steps, key=lambda s: float(s["t"])), waits, device)


def gpu_wait_intervals(spans: list[tl.Interval], clock: ClockView) -> list[tl.Interval]:
    """Each host wait cut to the part the GPU idled: its last ``idle_s`` (the GPU drains its queue,
    then waits). A wait the events did not cover (before the first CUDA forward) stays whole."""
    out = []
    for a, b in spans:
        idle = clock.waits.get(a)
        out.append((a, b) if idle is None else (max(a, b - idle), b))
    return out
