"""A hand-built SVG heatmap of throughput for one pair of axes (or one axis).

Each cell is the best samples/s over the other axes at that pair of values;
cells with no measured point say why (OOM, crash, skipped). The sweep's best
point is outlined. Labels are escaped here: the template inserts the SVG as markup.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpudoctor.render.sweep_cells import rate, short

CELL_W, CELL_H = 86, 34
LEFT, TOP = 130, 44
LOW, HIGH = (240, 244, 248), (0, 114, 178)  # light grey-blue -> the report's compute blue
SHORT_STATUS = {
    "oom": "OOM",
    "crashed": "crash",
    "timeout": "timeout",
    "skipped": "skip",
    "no_steady_state": "too short",
    "pruned": "pruned",
    "pending": "…",
}


def _color(fraction: float) -> str:
    r, g, b = (round(lo + (hi - lo) * fraction) for lo, hi in zip(LOW, HIGH, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def cell_values(
    points: list[dict[str, Any]], x_key: str, y_key: str | None
) -> dict[tuple[Any, Any], dict[str, Any]]:
    """(x value, y value) -> the best point there, or the first failure when none succeeded."""
    cells: dict[tuple[Any, Any], dict[str, Any]] = {}
    for p in points:
        if x_key not in p["params"] or (y_key and y_key not in p["params"]):
            continue
        at = (_key(p["params"][x_key]), _key(p["params"][y_key]) if y_key else None)
        old = cells.get(at)
        if old is None or _better(p, old):
            cells[at] = p
    return cells


def _key(value: Any) -> str:
    return repr(value)


def _score(p: dict[str, Any]) -> float | None:
    return (p.get("metrics") or {}).get("samples_per_s") if p["status"] == "ok" else None


def _better(p: dict[str, Any], old: dict[str, Any]) -> bool:
    new_s, old_s = _score(p), _score(old)
    return new_s is not None and (old_s is None or new_s > old_s)


def heatmap_svg(
    points: list[dict[str, Any]],
    x_axis: dict[str, Any],
    y_axis: dict[str, Any] | None,
    best_index: int | None,
) -> str:
    """``<svg>`` with ``x_axis`` across and ``y_axis`` down (one row when None)."""
    xs = list(x_axis["values"])
    ys = list(y_axis["values"]) if y_axis else [None]
    cells = cell_values(points, x_axis["key"], y_axis["key"] if y_axis else None)
    scores = [s for p in cells.values() if (s := _score(p)) is not None]
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    width, height = LEFT + CELL_W * len(xs) + 8, TOP + CELL_H * len(ys) + 8
    parts = [
        f'<svg class="chart heatmap" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">',
        _text(LEFT + CELL_W * len(xs) / 2, 14, short(x_axis["key"]), "middle", bold=True),
    ]
    if y_axis:
        parts.append(_text(8, TOP - 8, short(y_axis["key"]) + " ↓", "start", bold=True))
    for i, x in enumerate(xs):
        parts.append(_text(LEFT + CELL_W * (i + 0.5), TOP - 8, str(x), "middle"))
    for j, y in enumerate(ys):
        if y_axis:
            parts.append(_text(LEFT - 10, TOP + CELL_H * (j + 0.5) + 4, str(y), "end"))
        for i, x in enumerate(xs):
            point = cells.get((_key(x), _key(y) if y_axis else None))
            parts.append(_cell(LEFT + CELL_W * i, TOP + CELL_H * j, point, lo, hi, best_index))
    parts.append("</svg>")
    return "".join(parts)


def _cell(
    x: float, y: float, point: dict[str, Any] | None, lo: float, hi: float, best_index: int | None
) -> str:
    score = _score(point) if point else None
    if score is None:
        label = SHORT_STATUS.get(point["status"], point["status"]) if point else "not run"
        fill, ink = "#f6f7f9", "#667085"
        title = f"{point['label']}: {point['status']}" if point else "not measured"
    else:
        fraction = (score - lo) / (hi - lo) if hi > lo else 1.0
        fill, ink, label = (
            _color(fraction),
            "#ffffff" if fraction > 0.55 else "#1f2328",
            rate(score),
        )
        title = f"{point['label']}: {rate(score)} samples/s" if point else ""
    best = point is not None and point["index"] == best_index
    stroke = 'stroke="#D55E00" stroke-width="3"' if best else 'stroke="#ffffff" stroke-width="1"'
    mark = " ★" if best else ""
    return (
        f"<g><title>{escape(title)}</title>"
        f'<rect x="{x + 1:.0f}" y="{y + 1:.0f}" width="{CELL_W - 2}" height="{CELL_H - 2}" '
        f'rx="3" fill="{fill}" {stroke}/>'
        f'<text x="{x + CELL_W / 2:.0f}" y="{y + CELL_H / 2 + 4:.0f}" text-anchor="middle" font-size="12" '
        f'fill="{ink}">{escape(label + mark)}</text></g>'
    )


def _text(x: float, y: float, label: str, anchor: str, bold: bool = False) -> str:
    weight = ' font-weight="600"' if bold else ""
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="{anchor}" font-size="12" fill="#667085"{weight}>'
        f"{escape(label)}</text>"
    )
