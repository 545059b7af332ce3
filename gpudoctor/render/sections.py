"""The optional report sections (:data:`gpudoctor.core.schema.SECTIONS`) as display strings.

One view function per registered section, format-free: the HTML template prints the views and
:mod:`gpudoctor.render.markdown` formats the same ones, so adding a section is one entry here
and a test fails until it has one. ``attach`` has no view of its own: its lines lead the
report's notes, which every format prints. A section in an unexpected shape renders as
nothing rather than failing the page (a hand-edited report.json that still validated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpudoctor.core.schema import SECTIONS, ProfilerWindow, Report, Saves
from gpudoctor.render import nodes, preflight, trial
from gpudoctor.render.base import fmt_duration, fmt_pct, num, plural

T = TypeVar("T")

IN_NOTES = frozenset({"attach", "trackers"})  # shown through the report's notes
MAX_PROFILER_ROWS = 12


def _guarded(build: Callable[[T], dict[str, Any]], section: T | None) -> dict[str, Any] | None:
    """``build(section)``, or None for no section or one a renderer trips on."""
    if not isinstance(section, dict):
        return None
    try:
        return build(section)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


def profiler_view(section: list[ProfilerWindow] | None, report: Report) -> dict[str, Any] | None:
    """torch.profiler's windows beside the hooks' figures: the profiler's DataLoader wait as a
    share of each window (compare with the breakdown's data wait) and the GPU kernels' busy share.
    Two instruments agreeing is why the data wait can be trusted; disagreeing is worth a look."""
    if not isinstance(section, list) or not section:
        return None
    windows = [w for w in section if isinstance(w, dict)]
    rows = []
    for w in windows[:MAX_PROFILER_ROWS]:
        length = num(w.get("duration_s"))
        wait = num(w.get("dataloader_s"))
        rows.append((
            "" if w.get("rank") is None else str(w.get("rank")),
            fmt_duration(w.get("t_s")),
            fmt_duration(length),
            "" if w.get("steps") is None else str(w.get("steps")),
            fmt_pct(wait / length if wait is not None and length else None),
            fmt_pct(w.get("cuda_kernel_busy")),
        ))
    total = sum(num(w.get("duration_s")) or 0.0 for w in windows)
    waited = sum(num(w.get("dataloader_s")) or 0.0 for w in windows)
    hooks = num(((report or {}).get("breakdown") or {}).get("data_wait")) if isinstance(report, dict) else None
    summary = (f"{plural(len(windows), 'window')}, {fmt_duration(total)} in all: DataLoader wait "
               f"{fmt_pct(waited / total if total else None)} of the windows' time by the profiler; "
               f"the hooks' data wait {fmt_pct(hooks)} of the whole run's wall time.")
    more = len(windows) - len(rows)
    return {"summary": summary, "rows": rows,
            "more": f"{plural(more, 'more window')} in report.json" if more > 0 else ""}


def saves_view(section: Saves | None) -> dict[str, Any] | None:
    """Each save counted once, by kind; nothing when the run saved nothing."""
    if not isinstance(section, dict):
        return None
    rows = [(label, str(int(n or 0)), fmt_duration(section.get(f"{key}_s")))
            for label, key, n in (("periodic checkpoints", "checkpoint", section.get("checkpoints")),
                                  ("final save", "final", section.get("final")),
                                  ("side files (no tensors)", "side_files", section.get("side_files")))
            if num(n)]
    return {"rows": rows} if rows else None


VIEWS: dict[str, Callable[[Report], dict[str, Any] | None]] = {
    "saves": lambda r: saves_view(r.get("saves")),
    "profiler": lambda r: profiler_view(r.get("profiler"), r),
    "prediction_check": lambda r: _guarded(preflight.check_table, r.get("prediction_check")),
    "preflight": lambda r: _guarded(preflight.table, r.get("preflight")),
    "trial": lambda r: trial.view(r.get("trial")),
    "nodes": lambda r: nodes.view(r.get("nodes"), r),
}


def views(report: Report) -> dict[str, Any]:
    """``{key: view or None}`` for every registered section that has a view."""
    return {s.key: VIEWS[s.key](report) for s in SECTIONS if s.key in VIEWS}
