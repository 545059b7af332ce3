"""``sweep.html`` and ``sweep.md`` from ``sweep.json``: pure functions of the document.

The HTML reuses the report's Jinja2 environment (autoescape on) and stylesheet;
only the heatmap SVG, escaped in :mod:`.sweep_heatmap`, goes in as markup.
"""

from __future__ import annotations

import itertools
from typing import Any

from gpudoctor.render.base import fmt_speedup, num
from gpudoctor.render.html import markup, render_template
from gpudoctor.render.markdown import md_code, md_fence, md_text, table
from gpudoctor.render.sweep_cells import cells, columns, rate, short
from gpudoctor.render.sweep_heatmap import heatmap_svg

TIES_NAMED = 3  # a machine too noisy to tell many points apart: the closest ones, then a count


def headline(doc: dict[str, Any]) -> str:
    """One sentence: the winner and what it gains over the current setting."""
    best = doc.get("best")
    if best is None:
        return "No point trained steadily: see the table for why each one stopped."
    gain = best.get("speedup_vs_current")
    change = doc.get("change") or {}
    tied = best.get("tied_with") or []
    if tied:
        return _tied(best, tied)
    if not change.get("params"):
        return f"Your current setting is the fastest measured: {rate(best['samples_per_s'])} samples/s."
    versus = (
        f", {fmt_speedup(gain)} your current setting"
        if gain
        else " (your current setting was not measured)"
    )
    return f"Fastest: {best['label']} at {rate(best['samples_per_s'])} samples/s{versus}."


def _tied(best: dict[str, Any], tied: list[dict[str, Any]]) -> str:
    """No winner to name: the fastest and every point inside its noise, by name."""
    names = [f"{best['label']} ({rate(best['samples_per_s'])} samples/s)"] + [
        f"{t['label']} ({rate(t['samples_per_s'])}, {100 * t['slower_fraction']:.0f}% slower)"
        for t in tied[:TIES_NAMED]
    ]
    if len(tied) > TIES_NAMED:
        names.append(f"{len(tied) - TIES_NAMED} more (see the table)")
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    noise = max(num(p.get("noise")) or 0.0 for p in (best, *tied))
    current = best.get("current_index")
    with_current = any(t["index"] == current for t in tied) or best["index"] == current
    advice = (
        " Your current setting is among them: the measurement gives no reason to change it."
        if with_current
        else " Pick by other means (memory, the effective batch)."
    )
    return (
        f"Tied within the noise (up to ±{100 * noise:.0f}% per point, from its own step times): "
        f"{listed}.{advice}"
    )


def facts(doc: dict[str, Any]) -> list[tuple[str, str]]:
    grid, proto = doc["grid"], doc["protocol"]
    axes = "; ".join(
        f"{short(a['key'])} = {', '.join(map(str, a['values']))}" for a in grid["axes"]
    )
    threads = proto.get("torch_threads")
    window = (
        f"{proto['windows']} x {proto['window_s']:g} s after {proto['warmup_s']:g} s warm-up"
        + (f", {threads} torch thread" + ("s" if threads != 1 else "") if threads else "")
    )
    run = [p for p in doc["points"] if p["status"] not in ("pending", "skipped")]
    rows = [
        ("config", doc["config"]),
        ("grid", axes + (" (effective batch held)" if grid.get("hold_global_batch") else "")),
        (
            "points",
            f"{len(run)} measured of {grid['points_total']}"
            + (f", shard {grid['shard']}" if grid.get("shard") else "")
            + (f", merged from {len(doc['merged_from'])} shards" if doc.get("merged_from") else ""),
        ),
        ("window", window),
        ("host", f"{doc['host']['name']}, {doc['host']['cpus']} cores"),
    ]
    adaptive = doc.get("adaptive")
    if adaptive:
        rows.append(("adaptive", adaptive_text(adaptive)))
    return rows


def adaptive_text(a: dict[str, Any]) -> str:
    same = {
        True: "the same winner as the full grid",
        False: "a different winner from the full grid",
        None: "full grid not measured, so not compared",
    }[a.get("same_winner")]
    pruned = f", {a['pruned']} pruned early" if a.get("pruned") else ""
    found = f", best found at trial {a['found_at_trial']}" if a.get("found_at_trial") else ""
    resumed = f" (resumed: {a['resumed_trials']} from before)" if a.get("resumed_trials") else ""
    return (
        f"{a['method']}: {a['trials_used']} trials of {a['grid_points']} points{pruned}{found}"
        f"{resumed}; {same}"
    )


def heatmaps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    axes = [a for a in doc["grid"]["axes"] if len(a["values"]) > 1] or doc["grid"]["axes"][:1]
    best = (doc.get("best") or {}).get("index")
    pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = list(
        itertools.combinations(axes, 2)
    ) or [(axes[0], None)]
    return [
        {
            "title": short(x["key"]) + (f" × {short(y['key'])}" if y else ""),
            "pair": y is not None,
            "svg": heatmap_svg(doc["points"], x, y, best),
        }
        for x, y in pairs
    ]


def to_markdown(doc: dict[str, Any]) -> str:
    parts = [
        f"## gpudoctor sweep\n\n**{md_text(headline(doc))}**",
        "\n".join(f"- {md_text(name)}: {md_text(value)}" for name, value in facts(doc)),
    ]
    change = doc.get("change") or {}
    if change.get("params"):
        parts.append("### The change\n\n" + md_fence(change["yaml_diff"], "diff"))
        if change.get("python"):
            parts.append(
                md_fence(change["python"], "python")
                + "\n\nor on the command line: "
                + md_code(change["cli_args"])
            )
        if change.get("command"):
            parts.append("Check it: " + md_code(change["command"]))
        if change.get("lr_advice"):
            parts.append(md_text(change["lr_advice"]["text"]))
        if change.get("same_batch"):
            parts.append("Or keep the batch: " + md_text(change["same_batch"]["text"]) + ".")
    header = [name for name, _ in columns()]
    right = {i for i, (_, r) in enumerate(columns()) if r}
    rows = [[md_text(c) for c in cells(p)] for p in doc["points"]]
    parts.append("### Points\n\n" + table(header, rows, right))
    notes = doc.get("notes") or []
    if notes:
        parts.append("### Notes\n\n" + "\n".join(f"- {md_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"


def to_html(doc: dict[str, Any]) -> str:

    change = doc.get("change") or {}
    best = (doc.get("best") or {}).get("index")
    view = {
        "version": doc.get("version", ""),
        "headline": headline(doc),
        "facts": facts(doc),
        "change": change if change.get("params") else None,
        "heatmaps": [{**h, "svg": markup(h["svg"])} for h in heatmaps(doc)]
        if doc["points"]
        else [],
        "columns": columns(),
        "rows": [
            {"cells": cells(p), "best": p["index"] == best, "ok": p["status"] == "ok"}
            for p in doc["points"]
        ],
        "notes": doc.get("notes") or [],
        "cost_basis": sorted(
            {(p.get("cost") or {}).get("basis") or "" for p in doc["points"]} - {""}
        ),
    }
    return render_template("sweep.html.j2", view)
