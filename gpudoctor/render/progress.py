"""When the terminal gets live output, and the one-line progress bar of ``try`` and ``replay``.

Live output (``run``'s and ``attach``'s panel, the progress bars) is for a person at a terminal:
with stderr not a tty, ``--quiet``, ``--json`` or ``CI`` set (as every CI service sets it),
:func:`live_output` is False and the output is exactly what it was without them.
"""

from __future__ import annotations

import os
from typing import IO

FALSE_WORDS = ("", "0", "false", "no", "off")


def live_output(stream: IO[str], *, quiet: bool = False, as_json: bool = False) -> bool:
    """Whether ``stream`` may get a live panel or progress bar."""
    if quiet or as_json or os.environ.get("CI", "").strip().lower() not in FALSE_WORDS:
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def bar_line(label: str, done: float | None, total: float, unit: str, elapsed_s: float, left_s: float | None,
             width: int = 24) -> str:
    """``try: baseline [████████░░░░] 12/30 s of training · 41 s · about 18 s left``; before the
    training's first step (``done`` None) no time left is guessed, nor when ``left_s`` is None."""
    if done is None:
        return f"{label} · {elapsed_s:.0f} s · starting: waiting for the first training step"
    done = min(max(done, 0.0), total)
    filled = round(width * done / total) if total > 0 else width
    left = f" · about {left_s:.0f} s left" if left_s is not None else ""
    return f"{label} [{'█' * filled}{'░' * (width - filled)}] {done:.0f}/{total:.0f} {unit} · {elapsed_s:.0f} s{left}"
