"""What the terminal shows while attached: elapsed time and the breakdown so far.

Steps/s and the GPU's busy share now come from the lines added since the last tick
(:mod:`gpudoctor.live.pace`); the breakdown and the top finding so far from the light analysis
(:func:`gpudoctor.live.snapshot.take`). The figures come from the run folder itself (the same analysis as the final
report), so what the user watches is what the report will say. Analysing a
long recording gets slower as it grows, and this runs on the patient's
machine: the breakdown is recomputed at most every ~200x its own cost (0.5% of
one core at worst: on a host the training keeps busy it comes out of the
training) and no more often than every ``STEPS_PER_ANALYSIS`` steps
(the breakdown moves by the step: beside 10 s steps, re-reading it every 2 s is
waste); the clock ticks every second regardless, redrawn by our own tick (no
rich refresh thread). Without a TTY
(logs, CI) one plain line every 10 s replaces the rich panel, with the figures
of the last analysis (the same budget: a day-long recording is not re-read
every 10 s).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common.termtext import say, terminal_text
from gpudoctor.core.schema import BREAKDOWN_KEYS
from gpudoctor.live.pace import Pace, PaceReader
from gpudoctor.live.snapshot import take
from gpudoctor.render.live_panel import PanelFigures, panel_lines
from gpudoctor.render.progress import live_output

PLAIN_EVERY_S = 10.0
REFRESH_HZ = 1.0
MIN_ANALYSIS_S = 5.0
COST_FACTOR = 200.0  # analysing at most 0.5% of the time
STEPS_PER_ANALYSIS = 10.0
MAX_STEPS_WAIT_S = 30.0  # the step count waits no longer than this


@dataclass
class LiveState:
    pid: int
    source: str  # "in-process hooks" / "stack samples only" / ...
    duration_s: float | None
    started: float = field(default_factory=time.time)
    breakdown: dict[str, float | None] | None = None
    steps: int = 0
    sampled: bool = False
    notes: list[str] = field(default_factory=list)
    analysed_s: float | None = None  # seconds attached when the figures shown were computed
    top_rule: str | None = None  # the top finding of the last analysis, and its share
    top_share: float | None = None
    gpus: int | None = None
    pace: Pace = field(default_factory=Pace)  # steps/s and the GPU now, read each tick

    @property
    def elapsed_s(self) -> float:
        return time.time() - self.started


class LiveView:
    def __init__(self, folder: Path, state: LiveState, stream: Any = None, quiet: bool = False,
                 as_json: bool = False) -> None:
        self.folder = folder
        self.state = state
        self.stream = stream or sys.stderr
        # --quiet, --json, CI: what a log gets (the plain line every 10 s), as before the panel
        self.tty = live_output(self.stream, quiet=quiet, as_json=as_json)
        self.pace = PaceReader(folder)
        self._live: Any = None
        self._next_analysis = 0.0
        self._next_plain = time.time() + PLAIN_EVERY_S

    def start(self) -> None:
        if not self.tty:
            say(f"gpudoctor: attached to pid {self.state.pid}; Ctrl-C detaches and writes the report",
                file=self.stream, flush=True)
            return
        from rich.console import Console
        from rich.live import Live

        self._live = Live(self._render(), console=Console(file=self.stream), refresh_per_second=REFRESH_HZ,
                          transient=True, auto_refresh=False)
        self._live.start()

    def tick(self) -> None:
        """Call about once a second."""
        now = time.time()
        if self._live is not None:
            self.state.pace = self.pace.read(now)
            if now >= self._next_analysis:
                self._analyse(now)
            self._live.update(self._render(), refresh=True)
        elif now >= self._next_plain:
            self._next_plain = now + PLAIN_EVERY_S
            if now >= self._next_analysis:
                self._analyse(now)
            say(f"gpudoctor: {plain_line(self.state)}", file=self.stream, flush=True)

    def _analyse(self, now: float) -> None:
        t0 = time.perf_counter()
        try:
            snap = take(self.folder)
            s = self.state
            s.breakdown, s.steps, s.sampled, s.gpus = snap.breakdown, snap.steps, snap.sampled, snap.gpus
            s.top_rule, s.top_share, s.analysed_s = snap.top_rule, snap.top_share, s.elapsed_s
        except Exception as exc:  # a half-written folder must not end the session; shown, not hidden
            self.state.notes = [f"live figures unavailable: {exc}"]
        self._next_analysis = now + analysis_period_s(time.perf_counter() - t0, self.state)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _render(self) -> Any:
        from rich.markup import escape
        from rich.table import Table

        s = self.state
        limit = f" / {s.duration_s:.0f} s" if s.duration_s else ""
        title = f"gpudoctor attach: pid {s.pid} · {s.elapsed_s:.0f} s{limit} · {s.source}"
        table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
        table.add_column(width=11)
        table.add_column(width=30)
        table.add_column(justify="right", width=7)
        table.add_row("", f"[dim]{escape(pace_line(s))}[/dim]", "")
        if s.breakdown is None:
            table.add_row("", "waiting for the first training step…", "")
        else:
            for key in BREAKDOWN_KEYS:
                value = s.breakdown.get(key) or 0.0
                table.add_row(key, "█" * round(30 * value), f"{100 * value:.1f}%")
            label = "estimated from stack samples" if s.sampled else f"{s.steps} steps seen"
            if s.analysed_s is not None and s.elapsed_s - s.analysed_s >= 1:
                label += f" by {s.analysed_s:.0f} s"
            table.add_row("", f"[dim]{label} · Ctrl-C detaches[/dim]", "")
        for note in s.notes[-2:]:  # exception text may quote the patient's strings: no escape, no markup
            table.add_row("", f"[dim]{escape(terminal_text(note))}[/dim]", "")
        return table


def pace_line(s: LiveState) -> str:
    """steps/s, the GPU and the top finding: the first line of ``run``'s panel, less its title."""
    p = s.pace
    f = PanelFigures("", s.elapsed_s, p.steps or s.steps, p.steps_per_s, p.last_step_age_s,
                     gpus=p.gpus or s.gpus, gpu_busy=p.gpu_busy_now, top_rule=s.top_rule, top_share=s.top_share,
                     analysed_age_s=None if s.analysed_s is None else s.elapsed_s - s.analysed_s)
    return panel_lines(f)[0].split(" · ", 2)[-1]


def analysis_period_s(cost_s: float, state: LiveState) -> float:
    """Seconds until the next analysis: 50x its cost, and ``STEPS_PER_ANALYSIS`` steps up to a cap."""
    step_s = state.elapsed_s / state.steps if state.steps else 0.0  # start-up included: an upper bound
    by_steps = min(MAX_STEPS_WAIT_S, STEPS_PER_ANALYSIS * step_s)
    return max(MIN_ANALYSIS_S, COST_FACTOR * cost_s, by_steps)


def plain_line(s: LiveState) -> str:
    head = f"{s.elapsed_s:.0f} s attached to pid {s.pid} ({s.source})"
    if s.breakdown is None:
        return f"{head}; no training step seen yet"
    parts = ", ".join(f"{k} {100 * (v or 0):.0f}%" for k, v in s.breakdown.items() if (v or 0) >= 0.005)
    # the figures are those of the last analysis (at most every MIN_ANALYSIS_S..MAX_STEPS_WAIT_S): say when
    when = f" by {s.analysed_s:.0f} s" if s.analysed_s is not None and s.elapsed_s - s.analysed_s >= 1 else ""
    return f"{head}: {parts}" + (f" (from stack samples{when})" if s.sampled else f" ({s.steps} steps{when})")
