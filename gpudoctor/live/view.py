"""``run``'s live panel (and ``try``'s progress line) at the bottom of the terminal, once a second.

Each tick reads the lines added since the last (:class:`~gpudoctor.live.pace.PaceReader`: steps/s,
the GPU now) and the latest light analysis (:class:`~gpudoctor.live.snapshot.Analyst`, on its own
thread: the breakdown and the top finding), and redraws :class:`~gpudoctor.render.live_panel.BottomPanel`.
The doctor's main thread ticks it from its wait loop; the samplers have their own threads. A
view whose terminal fails (closed, resized to nothing) stops drawing and says nothing: the run
and its report go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from gpudoctor.common.termtext import terminal_line
from gpudoctor.live.pace import PaceReader
from gpudoctor.live.snapshot import Analyst
from gpudoctor.render.live_panel import BottomPanel, PanelFigures, panel_lines
from gpudoctor.render.progress import bar_line


class _Bottom:
    """The terminal's bottom rows while a child runs; any terminal failure ends the drawing, never the run."""

    def __init__(self, stream: IO[str]) -> None:
        self.started = time.time()
        self.panel: BottomPanel | None = BottomPanel(stream)

    def start(self) -> None:
        try:
            if self.panel is not None and not self.panel.start():
                self.panel = None
        except OSError:
            self.panel = None
        self.tick()

    def lines(self) -> list[str]:
        raise NotImplementedError

    def tick(self) -> None:
        if self.panel is None:
            return
        try:
            self.panel.draw(self.lines())
        except OSError:  # the terminal went away: the run goes on without the panel
            self.panel = None

    def stop(self) -> None:
        if self.panel is not None:
            with contextlib.suppress(OSError):
                self.panel.stop()
            self.panel = None


class LiveView(_Bottom):
    """The panel of ``run``: :meth:`start` once the child runs, :meth:`tick` about once a second, :meth:`stop`."""

    def __init__(self, folder: Path, title: str, stream: IO[str], analyse: bool = True) -> None:
        super().__init__(stream)
        self.title = title
        self.pace = PaceReader(folder)
        self.analyst = Analyst(folder) if analyse else None

    def start(self) -> None:
        super().start()
        if self.panel is not None and self.analyst is not None:
            self.analyst.start()

    def figures(self, now: float | None = None) -> PanelFigures:
        now = time.time() if now is None else now
        p = self.pace.read(now)
        f = PanelFigures(self.title, now - self.started, p.steps, p.steps_per_s, p.last_step_age_s,
                         gpus=p.gpus or None, gpu_busy=p.gpu_busy_now)
        snap = self.analyst.latest if self.analyst is not None else None
        if snap is not None:
            f.breakdown, f.sampled, f.analysed_age_s = snap.breakdown, snap.sampled, now - snap.at
            f.top_rule, f.top_share = snap.top_rule, snap.top_share
            if not p.gpus:
                f.gpus = snap.gpus  # the analysis read the whole GPU file: 0 is "no GPU", said
        if self.analyst is not None and self.analyst.error:
            f.note = self.analyst.error
        return f

    def lines(self) -> list[str]:
        return panel_lines(self.figures())

    def stop(self) -> None:
        if self.analyst is not None:
            self.analyst.stop()
        super().stop()


class ProgressView(_Bottom):
    """``try``'s and ``replay``'s one progress line, kept at the bottom like the panel."""

    def __init__(self, line: Callable[[float], str], stream: IO[str]) -> None:
        super().__init__(stream)
        self.line = line  # elapsed seconds -> the line

    def lines(self) -> list[str]:
        return [terminal_line(self.line(time.time() - self.started))]


class Limited(Protocol):
    """``try``'s :class:`~gpudoctor.tryfix.limit.TrainingLimit`: when training began (monotonic), for how long."""

    training_from: float | None
    seconds: float


def try_progress(label: str, limit: Limited, stream: IO[str]) -> ProgressView:
    """``try: baseline [███░░░] 12/30 s of training · 41 s · about 18 s left``."""
    def line(elapsed_s: float) -> str:
        done = time.monotonic() - limit.training_from if limit.training_from is not None else None
        left = limit.seconds - done if done is not None else None
        return bar_line(label, done, limit.seconds, "s of training", elapsed_s, max(0.0, left or 0.0))

    return ProgressView(line, stream)


def replay_progress(folder: Path, max_steps: int, max_seconds: float, stream: IO[str]) -> ProgressView:
    """``replay [███░░░] 8/20 steps · 12 s · about 9 s left``: whichever bound comes first."""
    pace = PaceReader(folder)
    first: list[float] = []

    def line(elapsed_s: float) -> str:
        now = time.time()
        p = pace.read(now)
        if not p.steps:
            return bar_line("replay", None, max_steps, "steps", elapsed_s, None)
        if not first:
            first.append(now)
        left = [max_seconds - (now - first[0])]
        if p.steps_per_s:
            left.append((max_steps - p.steps) / p.steps_per_s)
        return bar_line("replay", p.steps, max_steps, "steps", elapsed_s, max(0.0, min(left)))

    return ProgressView(line, stream)
