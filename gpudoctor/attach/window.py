"""What an attach session did, and which stretch of the process's life the report covers.

A process met mid-run has no observed startup: its window starts when the
hooks went in (they mark the first step there), so startup is 0. A process
met before its first step is still starting: its window starts at the
process's own start, and everything before the first step is startup, as
under ``gpudoctor run``, though only the part after the attach was seen.

Written to meta.json: ``attach_time``, ``detach_time``, ``attach`` (per-process
details) and ``attach_notes`` (one line each, for ``info`` findings).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.analysis.sampled import LOOP, Code, load_stack_rows
from gpudoctor.common.wording import plural
from gpudoctor.report.attach import UNAVAILABLE_WITHOUT_HOOKS


@dataclass
class TargetRecord:
    pid: int
    rank: int | None
    create_time: float
    requested_at: float | None = None
    waited_s: float | None = None  # waiting for a moment when a debugger stop cannot break the process
    waiting_for: str | None = None  # while it waits: the hazard holding the stop back
    tries: int = 0  # injections started (another after one ran out of time: see attach.budget)
    try_budget_s: float | None = None  # the last try's time limit, scaled to the machine's load
    budget_factor: float | None = None  # how much longer than on a quiet machine (attach.budget.Budget)
    load_per_core: float | None = None  # what the factor was read from
    run_delay_share: float | None = None
    queued_s: float | None = None  # from the request to the bootstrap queued in the process, all tries
    method: str | None = None  # "gdb" | "remote_exec"
    gdb_s: float | None = None  # gdb's whole run; the process is stopped only between attach and detach
    installed_at: float | None = None
    install_s: float | None = None  # the patient's main thread, busy in the payload (imports, gc scan, catch-up)
    uninstall_s: float | None = None  # the watchdog thread removing the hooks (holds the GIL meanwhile)
    underway: bool | None = None  # training had begun when the hooks went in
    detached: bool | None = None
    error: str | None = None


@dataclass
class AttachRecord:
    attach_time: float
    root_start_time: float = 0.0
    end_time: float | None = None
    detach_time: float | None = None
    detach_wait_s: float | None = None  # how long the processes had to confirm the detach (attach.budget)
    ended_by: str | None = None  # "exit" | "duration" | "interrupted" | "terminated"
    inject: bool = True
    targets: dict[int, TargetRecord] = field(default_factory=dict)
    stack_samples: int = 0
    stack_errors: list[str] = field(default_factory=list)
    sample_rate_hz: float = 0.0

    @property
    def hooked(self) -> list[TargetRecord]:
        return [r for r in self.targets.values() if r.installed_at is not None]

    def source(self) -> str:
        """Where the figures come from, for the live view."""
        if self.hooked:
            return f"in-process hooks in {plural(len(self.hooked), 'process', 'processes')} + stack samples"
        if not self.inject:
            return "stack samples only (--no-inject)"
        waiting = [r for r in self.targets.values() if r.waiting_for]
        if waiting:
            return (f"stack samples; hooks wait for a safe moment in pid {waiting[0].pid}: "
                    f"{waiting[0].waiting_for}")
        if not self.targets or any(r.error is None for r in self.targets.values()):
            return "loading the in-process hooks…"
        return "stack samples only (hooks not loaded)"

    def window_start(self, folder: Path) -> float:
        """Start of the recording window (see the module docstring)."""
        hooked = self.hooked
        if hooked:
            underway = [r.installed_at for r in hooked if r.underway and r.installed_at is not None]
            return max(underway) if underway else self.root_start_time or self.attach_time
        if _sampled_underway(folder):
            return self.attach_time
        return self.root_start_time or self.attach_time

    def notes(self, start: float) -> list[str]:
        notes = [n for n in (self._hook_note(), self._start_note(start)) if n]
        if self.hooked:
            notes += [f"In-process hooks not loaded into pid {r.pid}"
                      + (f" (rank {r.rank})" if r.rank is not None else "")
                      + f": {r.error or 'it did not run the injected code'}; its figures are estimated from "
                      "stack samples" for r in self.targets.values() if r.installed_at is None]
        notes += [f"pid {r.pid} did not confirm removing the hooks within a few seconds; they remove themselves "
                  "the next time it runs Python code" for r in self.hooked if r.detached is False]
        if self.stack_errors:
            lead = "No stack samples" if not self.stack_samples else "Some stack sampling windows failed"
            notes.append(f"{lead}: {'; '.join(self.stack_errors[:2])}")
        return notes

    def _hook_note(self) -> str | None:
        if self.hooked:
            return None
        samples = f"{self.stack_samples} stack samples at {self.sample_rate_hz:g} Hz"
        if self.stack_samples:
            samples += f", about ±{100 * math.sqrt(0.25 / self.stack_samples):.0f} points"
        return (f"In-process hooks not loaded ({self._why_no_hooks()}). The breakdown is estimated from "
                f"{samples}; {UNAVAILABLE_WITHOUT_HOOKS}.")

    def _why_no_hooks(self) -> str:
        if not self.inject:
            return "--no-inject was given"
        if not self.targets:
            return "no Python training process was found under the pid"
        reasons = set()
        for r in self.targets.values():
            if r.error:
                reasons.add(r.error)
            elif r.method is not None:
                reasons.add(f"pid {r.pid} did not run the injected code before the end "
                            "(busy in native code, or exiting)")
        return "; ".join(sorted(reasons)) or "injection did not finish"

    def _start_note(self, start: float) -> str | None:
        before_s = self.attach_time - self.root_start_time if self.root_start_time else 0.0
        if before_s < 1.0:
            return None
        if start >= self.attach_time:
            return (f"Attached {before_s:.0f} s after the process started, while it was training: the figures cover "
                    "the part observed, and the run's startup is not included.")
        return (f"Attached {before_s:.1f} s after the process started, before its first training step: those "
                "seconds count as startup, but what they went to was only observed from the attach on.")

    def meta_fields(self, folder: Path) -> dict[str, Any]:
        start = self.window_start(folder)
        fields: dict[str, Any] = {
            "start_time": start,
            "started_at": dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat(),
            "attach_time": self.attach_time,
            "detach_time": self.detach_time,
            "attach_notes": self.notes(start),
            "attach": {
                "ended_by": self.ended_by,
                "inject": self.inject,
                "root_start_time": self.root_start_time or None,  # the process's age at the attach, for the report
                "targets": [asdict(r) for r in self.targets.values()],
                "stack_samples": self.stack_samples,
                "sample_rate_hz": self.sample_rate_hz,
                "detach_wait_s": self.detach_wait_s,
            },
        }
        if self.end_time is not None:
            fields["end_time"] = self.end_time
        return fields


FIRST_LOOK_S = 1.0  # how much of the first samples may show the loop before calling it underway
_STARTING = {Code.FORMAT, Code.MODEL_LOAD, Code.TOKENIZE}  # what a process does before its loop


def _sampled_underway(folder: Path) -> bool:
    """Was a (non-worker) process already training when the samples began?

    Yes when its first second of samples shows the loop (a step, a batch wait, a
    backward, a hand-written eval) before anything only startup does: a plain SGD
    loop spends part of each step in the script's own code, so its very first
    sample need not be in the loop.
    """
    rows = [r for r in load_stack_rows(folder) if r.get("role") == "main" and r["codes"]]
    if not rows:
        return True  # nothing seen: do not claim a startup we never observed
    t0 = min(r["t"] for r in rows)
    for r in rows:
        if r["t"] - t0 > FIRST_LOOK_S:
            continue
        for code in r["codes"][: max(1, int(FIRST_LOOK_S * float(r["rate_hz"])))]:
            if code in _STARTING:
                break
            if code in LOOP or code == Code.EVAL:
                return True
    return False
