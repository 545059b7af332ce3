"""Small hand-built inline SVG charts: the timeline (with memory over time) and the breakdown bar.

Hand-built rather than matplotlib, which the project therefore does not depend on.
Measured here: importing matplotlib costs 0.52 s of a busy 2-core box on every
report, and its SVG of a 3x3 sweep heatmap is 17 kB of glyph paths (text turned
into outlines a reviewer cannot search), against a few kB of plain escaped text
here; crisp at any zoom, and the colours are the same CSS-free constants the legend
uses. Every text that could come from a run is escaped here, because
the template inserts these strings as markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape
from typing import Any

from gpudoctor.common.wording import SPAN_LABELS
from gpudoctor.core.schema import Breakdown, Timeline
from gpudoctor.render.base import (
    SLICE_COLORS,
    breakdown_items,
    downsample,
    fmt_pct,
    num,
)

WIDTH = 1000
LEFT, RIGHT = 92, 12
PLOT_W = WIDTH - LEFT - RIGHT
LANE_H, LANE_GAP = 11, 5
PANEL_H, PANEL_GAP = 70, 26
BIN_PX = 2
MAX_POINTS = min(2000, PLOT_W)
SPAN_LANES = ("startup", "format", "data_wait", "checkpoint", "eval")
INK, GRID, MUTED = "#1f2328", "#e3e6ea", "#667085"
NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800)


def _x(t_s: float, duration_s: float) -> float:
    return LEFT + max(0.0, min(t_s, duration_s)) / duration_s * PLOT_W


def _text(x: float, y: float, label: str, anchor: str = "end", size: int = 11) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'fill="{MUTED}">{escape(label)}</text>'
    )


def _span_xs(spans: list[list[float]] | None, duration_s: float) -> list[tuple[float, float]]:
    """``[[start_s, end_s], ...]`` as sorted pixel intervals, bad entries dropped."""
    xs = []
    for span in spans or []:
        if not isinstance(span, (list, tuple)) or len(span) < 2:
            continue
        start, end = num(span[0]), num(span[1])
        if start is not None and end is not None and end >= start:
            xs.append((_x(start, duration_s), _x(end, duration_s)))
    return sorted(xs)


def _span_path(spans: list[list[float]] | None, duration_s: float, y: float, h: float) -> str:
    """Solid rectangles for spans, merged at pixel resolution."""
    merged: list[list[float]] = []
    for x0, x1 in _span_xs(spans, duration_s):
        x1 = max(x1, x0 + 1)
        if merged and x0 <= merged[-1][1] + 0.5:
            merged[-1][1] = max(merged[-1][1], x1)
        else:
            merged.append([x0, x1])
    return "".join(f"M{a:.1f} {y:.1f}h{b - a:.1f}v{h:.1f}h{a - b:.1f}z" for a, b in merged)


def _coverage(spans: list[list[float]] | None, duration_s: float) -> list[float]:
    """Fraction of each BIN_PX-wide column of the plot that spans cover."""
    bins = [0.0] * (PLOT_W // BIN_PX + 1)
    for x0, x1 in _span_xs(spans, duration_s):
        a, b = (x0 - LEFT) / BIN_PX, (x1 - LEFT) / BIN_PX
        for i in range(int(a), min(int(b), len(bins) - 1) + 1):
            bins[i] += max(0.0, min(b, i + 1) - max(a, i))
    return [min(1.0, c) for c in bins]


def _density_paths(spans: list[list[float]] | None, duration_s: float, y: float, color: str) -> list[str]:
    """A lane shaded by how much of each moment the spans cover (4 opacity levels),
    so thousands of short data waits read as "waiting ~half the time"."""
    levels: dict[int, list[list[int]]] = {}
    for i, c in enumerate(_coverage(spans, duration_s)):
        if c <= 0:
            continue
        level = min(4, int(-(-c * 4 // 1)))
        runs = levels.setdefault(level, [])
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    out = []
    for level, runs in sorted(levels.items()):
        d = "".join(
            f"M{LEFT + a * BIN_PX} {y:.1f}h{(b - a) * BIN_PX}v{LANE_H}h-{(b - a) * BIN_PX}z"
            for a, b in runs
        )
        out.append(f'<path d="{d}" fill="{color}" fill-opacity="{level / 4:.2f}"/>')
    return out


def lane_kinds(spans: dict[str, list[list[float]]]) -> list[str]:
    """Span lanes to draw: the standard ones (``format`` only when present), then extras."""
    kinds = [k for k in SPAN_LANES if k != "format" or spans.get(k)]
    return kinds + [k for k in spans if k not in SPAN_LANES and spans.get(k)]


def _lanes(spans: dict[str, list[list[float]]], duration_s: float, y: float) -> tuple[list[str], float]:
    out = []
    for kind in lane_kinds(spans):
        color = SLICE_COLORS.get(kind, "#777777")
        out.append(_text(LEFT - 8, y + LANE_H - 1.5, SPAN_LABELS.get(kind, kind)))
        out.append(
            f'<rect x="{LEFT}" y="{y:.1f}" width="{PLOT_W}" height="{LANE_H}" fill="#f4f5f7"/>'
        )
        out += _density_paths(spans.get(kind), duration_s, y, color)
        y += LANE_H + LANE_GAP
    return out, y


def _step_ticks(steps_t_s: list[float] | None, duration_s: float, y: float) -> list[str]:
    xs = sorted({round(_x(t, duration_s)) for t in map(num, steps_t_s or []) if t is not None})
    out = [_text(LEFT - 8, y + LANE_H - 1.5, "steps")]
    if xs:
        d = "".join(f"M{x} {y:.1f}v{LANE_H}" for x in xs)
        out.append(f'<path d="{d}" stroke="{INK}" stroke-width="1" opacity="0.55"/>')
    return out


def _panel(
    t_s: list[Any], values: Any, duration_s: float, y: float, label: str, color: str
) -> list[str]:
    """A 0..max% line panel with a light fill; 'unavailable' when values is None."""
    out = [_text(LEFT, y - 6, label, "start", 12)]
    out.append(
        f'<rect x="{LEFT}" y="{y:.1f}" width="{PLOT_W}" height="{PANEL_H}" fill="none" stroke="{GRID}"/>'
    )
    if values is None:
        out.append(
            _text(
                LEFT + PLOT_W / 2,
                y + PANEL_H / 2 + 4,
                "unavailable: no GPU busy samples",
                "middle",
                12,
            )
        )
        return out
    ts, vs = downsample(list(t_s or []), list(values), MAX_POINTS)
    top = max([100.0] + [-(-v // 100) * 100 for v in vs])
    for frac in (0.5, 1.0):
        gy = y + PANEL_H * (1 - frac)
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="{GRID}"/>'
        )
        out.append(_text(LEFT - 8, gy + 4, f"{top * frac:.0f}%", size=10))
    if not ts:
        return out
    pts = " ".join(
        f"{_x(t, duration_s):.1f},{y + PANEL_H * (1 - max(0.0, v) / top):.1f}"
        for t, v in zip(ts, vs, strict=True)
    )
    base = y + PANEL_H
    x0, x1 = _x(ts[0], duration_s), _x(ts[-1], duration_s)
    out.append(
        f'<path d="M{x0:.1f} {base:.1f}L{pts.replace(" ", "L")}L{x1:.1f} {base:.1f}z" fill="{color}" opacity="0.18"/>'
    )
    out.append(
        f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.4" stroke-linejoin="round"/>'
    )
    return out


DASHES = ("", "5 3", "2 2", "8 3 2 3")  # one line style per memory series, said in the label
DASH_WORDS = ("solid", "dashed", "dotted", "dash-dot")


def _mib_panel(lines: list[tuple[list[Any], list[Any], str, str]], duration_s: float, y: float) -> list[str]:
    """Memory over time: one line per series ``(t_s, mib, label, colour)``, 0..the largest value in
    MiB/GiB, each in its own line style (:data:`DASHES`), said in the label. Drawn only when some
    series has values."""
    series = [(ts, vs, label, color) for ts, vs, label, color in lines
              if any(num(v) is not None for v in vs or [])]
    if not series:
        return []
    label = "Memory: " + ", ".join(f"{name} ({DASH_WORDS[min(i, len(DASH_WORDS) - 1)]})"
                                   for i, (_, _, name, _) in enumerate(series))
    out = [_text(LEFT, y - 6, label, "start", 12),
           f'<rect x="{LEFT}" y="{y:.1f}" width="{PLOT_W}" height="{PANEL_H}" fill="none" stroke="{GRID}"/>']
    top = max(num(v) or 0.0 for _, vs, _, _ in series for v in vs) or 1.0
    for frac in (0.5, 1.0):
        gy = y + PANEL_H * (1 - frac)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{gy:.1f}" y2="{gy:.1f}" stroke="{GRID}"/>')
        out.append(_text(LEFT - 8, gy + 4, _mib(top * frac), size=10))
    for i, (ts, vs, _, color) in enumerate(series):
        kept = [(tt, v) for t, x in zip(ts, vs, strict=False)
                if (tt := num(t)) is not None and (v := num(x)) is not None]
        if not kept:
            continue
        xs, ys = downsample([t for t, _ in kept], [v for _, v in kept], MAX_POINTS)
        pts = " ".join(f"{_x(t, duration_s):.1f},{y + PANEL_H * (1 - max(0.0, v) / top):.1f}"
                       for t, v in zip(xs, ys, strict=True))
        pattern = DASHES[min(i, len(DASHES) - 1)]
        dash = f' stroke-dasharray="{pattern}"' if pattern else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.4"{dash}/>')
    return out


def _mib(v: float) -> str:
    return f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB"


MAX_TICKS = 10  # labels under the timeline, past its zero


def tick_step_s(duration_s: float) -> float:
    """Seconds between the axis labels: the first nice step that needs at most ten, and past the
    table's 8 hours whole multiples of it (a two-week attach gets 40-hour ticks, not 42 of 8 hours;
    a meta whose start no calendar holds, 2,900 years, still ten)."""
    step = next((s for s in NICE_STEPS_S if duration_s / s <= MAX_TICKS), None)
    if step is not None:
        return float(step)
    last = NICE_STEPS_S[-1]
    return last * math.ceil(duration_s / (MAX_TICKS * last))


def _axis(duration_s: float, y: float) -> list[str]:
    step = tick_step_s(duration_s)
    out = [f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="{MUTED}"/>']
    t = 0.0
    while t <= duration_s + 1e-9:
        x = _x(t, duration_s)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y:.1f}" y2="{y + 4:.1f}" stroke="{MUTED}"/>'
        )
        out.append(_text(x, y + 16, _clock(t), "middle", 10))
        t += step
    return out


def _clock(t_s: float) -> str:
    """Axis label: ``0``, ``45s``, ``5m``, ``1h30m``."""
    t = round(t_s)
    if t == 0:
        return "0"
    if t < 60:
        return f"{t}s"
    h, m, s = t // 3600, t % 3600 // 60, t % 60
    if h:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    return f"{m}m{s:02d}s" if s else f"{m}m"


def _startup_shade(spans: dict[str, list[list[float]]], duration_s: float, y0: float, y1: float) -> str:
    path = _span_path(spans.get("startup"), duration_s, y0, y1 - y0)
    return f'<path d="{path}" fill="{SLICE_COLORS["startup"]}" opacity="0.10"/>' if path else ""


def cpu_label(cores: int | None) -> str:
    """The CPU panel's label: one convention with ``shares.cpu_busy`` (of all cores)."""
    return f"CPU % of all {cores} cores (training processes)" if cores else "CPU % (100 = one core)"


def timeline_svg(timeline: Timeline | None, duration_s: Any = None, cores: int | None = None,
                 gpu: bool = True) -> str:
    """The run over time: span lanes, step ticks, GPU busy % and CPU % panels.

    ``cores``: the series' CPU (100 = one core, as recorded) is drawn as % of all cores, 0-100,
    so two reports read alike whatever their machine. ``gpu=False`` (no GPU on the machine):
    no GPU panel, rather than an empty one."""
    timeline = timeline or {}
    duration = num(timeline.get("duration_s")) or num(duration_s)
    if not duration or duration <= 0:
        return ""
    spans = timeline.get("spans") or {}
    series = timeline.get("series") or {}
    lanes, y = _lanes(spans, duration, 4)
    body = lanes + _step_ticks(timeline.get("steps_t_s"), duration, y)
    y += LANE_H + PANEL_GAP
    panels_top = y
    t_s = series.get("t_s") or []
    if gpu:
        body += _panel(
            series.get("gpu_t_s") or t_s, series.get("gpu_busy_pct"), duration, y, "GPU busy %",
            SLICE_COLORS["compute"]
        )
        y += PANEL_H + PANEL_GAP
    cpu = series.get("cpu_pct") or []
    if cores:
        # capped like shares.cpu_busy: above all cores is the sampler's jitter, not more CPU
        cpu = [min(100.0, x / cores) if (x := num(v)) is not None else None for v in cpu]
    body += _panel(t_s, cpu, duration, y, cpu_label(cores), "#3d4852")
    y += PANEL_H
    memory = _mib_panel([(t_s, series.get("rss_mib") or [], "host RSS of the training processes", "#3d4852"),
                         (series.get("gpu_t_s") or [], series.get("gpu_mem_mib") or [], "their GPU memory",
                          SLICE_COLORS["compute"]),
                         (series.get("alloc_t_s") or [], series.get("alloc_allocated_mib") or [],
                          "CUDA allocator: allocated", "#b7791f"),
                         (series.get("alloc_t_s") or [], series.get("alloc_reserved_mib") or [],
                          "CUDA allocator: reserved", "#6b46c1")], duration, y + PANEL_GAP)
    if memory:
        body += memory
        y += PANEL_GAP + PANEL_H
    shade = _startup_shade(spans, duration, panels_top, y)
    body = [shade] + body + _axis(duration, y + 6)
    height = y + 30
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height:.0f}" role="img" '
        f'aria-label="timeline of the run">' + "".join(body) + "</svg>"
    )


def breakdown_bar_svg(breakdown: Breakdown | Mapping[str, float | None] | None, height: int = 34) -> str:
    """Stacked horizontal bar of the breakdown, labelled where a slice is wide enough."""
    items = [(k, f) for k, f in breakdown_items(breakdown) if f is not None and f > 0]
    total = sum(f for _, f in items)
    if total <= 0:
        return ""
    x, parts = 0.0, []
    for key, frac in items:
        w = frac / total * WIDTH
        label = f"{SPAN_LABELS.get(key, key)} {fmt_pct(frac)}"
        color = SLICE_COLORS.get(key, "#777777")
        parts.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" fill="{color}">'
            f"<title>{escape(label)}</title></rect>"
        )
        short = fmt_pct(frac)
        label_shown = (
            label if w >= 7.5 * len(label) + 12 else short if w >= 7.5 * len(short) + 8 else ""
        )
        if label_shown:
            parts.append(
                f'<text x="{x + w / 2:.1f}" y="{height / 2 + 4.5:.1f}" text-anchor="middle" '
                f'font-size="13" fill="#fff" font-weight="600">{escape(label_shown)}</text>'
            )
        x += w
    return (
        f'<svg class="bar" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="time breakdown">' + "".join(parts) + "</svg>"
    )
