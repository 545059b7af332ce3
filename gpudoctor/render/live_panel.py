"""The live panel's words, and the two bottom lines of the terminal it is drawn on.

``run`` shares its terminal with the training: the child writes to the same tty, straight,
and nothing of ours may come between them (a pipe would change its buffering and its
``isatty``). A panel redrawn in place (rich's Live) moves the cursor up over lines it thinks
are its own and overwrites the training's; a status line refreshed with ``\\r`` is torn by
every line the training prints. So :class:`BottomPanel` does what apt's progress line does:
it narrows the terminal's scrolling region to all rows but the last :data:`ROWS`
(DECSTBM), and draws there with the cursor saved and restored, in one write. The training's
lines scroll above, untouched; on exit the region is given back and the panel erased.
``attach`` has its terminal to itself: its panel is a rich table with the same lines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO

from gpudoctor.common.termtext import terminal_line
from gpudoctor.core.schema import BREAKDOWN_KEYS

ROWS = 2  # the panel's height
MIN_ROWS, MIN_COLS = 8, 40  # a smaller terminal gets no panel: it would hide most of the training's lines


@dataclass
class PanelFigures:
    """What the panel says; None is a figure not observed yet (said so, never guessed)."""

    title: str  # "gpudoctor run"
    elapsed_s: float
    steps: int = 0
    steps_per_s: float | None = None
    last_step_age_s: float | None = None
    gpus: int | None = None  # None: not known yet; 0: no GPU
    gpu_busy: float | None = None  # 0-1, NVML's latest rows
    breakdown: dict[str, float | None] | None = None
    sampled: bool = False
    top_rule: str | None = None
    top_share: float | None = None
    analysed_age_s: float | None = None  # seconds since the breakdown and finding were computed; None: not yet
    note: str | None = None


def panel_lines(f: PanelFigures) -> list[str]:
    """Two lines: the pace, the GPU and the top finding; then the breakdown so far."""
    if f.steps_per_s is not None:
        pace = f"{f.steps_per_s:.2f} steps/s ({f.steps} steps)" if f.steps_per_s < 10 else \
            f"{f.steps_per_s:.0f} steps/s ({f.steps} steps)"
    else:
        pace = f"{f.steps} steps" if f.steps else "no training step yet"
    if f.last_step_age_s is not None and f.steps_per_s is not None and f.last_step_age_s > max(5.0, 3 / f.steps_per_s):
        pace += f", none for {f.last_step_age_s:.0f} s"
    if f.gpus == 0:
        gpu = "no GPU"
    elif f.gpus is None or f.gpu_busy is None:
        gpu = "GPU busy unavailable yet"
    else:
        gpu = f"GPU busy {100 * f.gpu_busy:.0f}%"
    head = f"{f.title} · {f.elapsed_s:.0f} s · {pace} · {gpu}"
    if f.analysed_age_s is None:
        top = "top finding: after the first analysis"
    elif f.top_rule is None:
        top = "top finding: none so far"
    else:
        top = f"top finding: {f.top_rule} {100 * (f.top_share or 0):.0f}%"
    return [terminal_line(f"{head} · {top}"), terminal_line(breakdown_line(f))]


def breakdown_line(f: PanelFigures) -> str:
    if f.note:
        return f.note
    if f.breakdown is None:
        return "breakdown: after the first training step" if f.analysed_age_s is not None else \
            "breakdown: after the first analysis"
    parts = [f"{k} {100 * (f.breakdown.get(k) or 0):.0f}%" for k in BREAKDOWN_KEYS if (f.breakdown.get(k) or 0) >= 0.005]
    when = f" ({f.analysed_age_s:.0f} s ago)" if f.analysed_age_s is not None and f.analysed_age_s >= 2 else ""
    source = ", from stack samples" if f.sampled else ""
    return "so far: " + " · ".join(parts) + when + source


class BottomPanel:
    """:data:`ROWS` lines kept at the bottom of a terminal below the scrolling region (see the module)."""

    def __init__(self, stream: IO[str]) -> None:
        self.fd = stream.fileno()
        self.size: os.terminal_size | None = None

    def start(self) -> bool:
        """Reserve the bottom rows; False (nothing written) on a terminal too small for it."""
        size = os.get_terminal_size(self.fd)
        if size.lines < MIN_ROWS or size.columns < MIN_COLS:
            return False
        # room first: ROWS new lines (the screen scrolls if the cursor is at the bottom), then back up
        self._write("\n" * ROWS + f"\x1b[{ROWS}A" + self._region(size))
        self.size = size
        return True

    def draw(self, lines: list[str]) -> None:
        size = os.get_terminal_size(self.fd)
        out = ""
        if size != self.size:  # resized: the scrolling region follows
            out += self._region(size)
            self.size = size
        if size.lines < MIN_ROWS or size.columns < MIN_COLS:
            if out:
                self._write(out)
            return
        out += "\x1b7"  # save the cursor (the training's place)
        for i, line in enumerate(lines[:ROWS]):
            out += f"\x1b[{size.lines - ROWS + 1 + i};1H\x1b[2K" + line[: size.columns - 1]
        self._write(out + "\x1b8")

    def stop(self) -> None:
        """Give the whole screen back and erase the panel; the cursor stays after the training's last line."""
        if self.size is None:
            return
        rows = self.size.lines
        clear = "".join(f"\x1b[{rows - ROWS + 1 + i};1H\x1b[2K" for i in range(ROWS))
        self._write("\x1b7\x1b[r\x1b8\x1b7" + clear + "\x1b8")
        self.size = None

    @staticmethod
    def _region(size: os.terminal_size) -> str:
        """Scroll rows 1..lines-ROWS only; DECSTBM homes the cursor, so it is saved and put back."""
        return f"\x1b7\x1b[1;{size.lines - ROWS}r\x1b8"

    def _write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:  # one write in practice (a few hundred bytes to a tty)
            data = data[os.write(self.fd, data):]
