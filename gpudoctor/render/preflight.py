"""The replay's report sections as display rows: ``preflight`` (the full run predicted on a GPU
not rented yet, before and after the fixes) and ``prediction_check`` (a replay on a GPU: the
prediction for it beside what was measured).

Shared by the HTML and Markdown renderers and the replay's terminal output; it lives in render/ so
no renderer imports a mode's package. The Markdown here is raw: the report's renderer passes
sections through :func:`gpudoctor.render.markdown._inert` first.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.core.schema import PredictionCheck, Preflight

ROWS: tuple[tuple[str, str, str], ...] = (
    ("wall time", "wall_h", "{:.2f} h"),
    ("cost", "cost_usd", "${:,.2f}"),
    ("GPU busy", "gpu_busy_fraction", "{:.0%}"),
    ("data stall", "data_stall_share", "{:.1%}"),
    ("real tokens/s", "tokens_per_s", "{:,.0f}"),
    ("startup before first step", "startup_s", "{:,.0f} s"),
    ("checkpoint time", "checkpoint_s", "{:,.0f} s"),
    ("padding share of tokens", "pad_fraction", "{:.0%}"),
    ("tokens/sample computed", "tokens_per_sample_padded", "{:,.0f}"),
    ("optimizer steps", "optimizer_steps", "{:,}"),
    ("step time", "step_s", "{:.3f} s"),
    ("precision (peak TFLOP/s)", "precision", "{}"),
    ("max_length / padding", "max_length", "{}"),
    ("DataLoader workers", "dataloader_num_workers", "{}"),
    ("save_steps", "save_steps", "{}"),
)


def _cell(fig: dict[str, Any], key: str, fmt: str) -> str:
    value = fig.get(key)
    if key == "precision":
        return f"{value} ({fig['peak_tflops']:g})"
    if key == "max_length":
        return f"{value} / {fig['padding']}"
    return "-" if value is None else fmt.format(value)


def table(prediction: Preflight) -> dict[str, Any]:
    """Display strings for the before/after table; shared by this Markdown and the HTML report."""
    target = prediction["target"]
    before, after = prediction["before"], prediction["after"]
    return {
        "title": (
            f"Preflight on {target['gpus']} x {target['name']} at ${target['price_per_gpu_hour']:.2f}/GPU-hour, "
            f"MFU {prediction['assumptions']['mfu']:g}: speedup x{prediction['speedup']:.2f}, "
            f"saves ${prediction['saved_usd']:,.2f}"
        ),
        "rows": [(label, _cell(before, k, f), _cell(after, k, f)) for label, k, f in ROWS],
        "fixes": [f"{fx['rule']}, saves {fx['saves_h']:.2f} h: {fx['summary']}" for fx in prediction["fixes"]],
        "notes": [str(n) for n in prediction["notes"]],
    }


def markdown(prediction: Preflight) -> str:
    """The before/after table, the fixes and the notes."""
    t = table(prediction)
    lines = [t["title"], "", "| | before | after fixes |", "|---|---|---|"]
    lines += [f"| {label} | {b} | {a} |" for label, b, a in t["rows"]]
    lines.append("")
    lines += [f"- fix ({fx})" for fx in t["fixes"]]
    lines += [f"- note: {note}" for note in t["notes"]]
    return "\n".join(lines)


_UNITS = {"s": "{:.4f} s", "fraction": "{:.1%}", "per_s": "{:,.1f}"}


def check_table(check: PredictionCheck) -> dict[str, Any]:
    """Display strings for the prediction-vs-measurement table of a replay on a GPU."""
    if not check.get("known"):
        return {"title": f"Prediction check on {check.get('gpu') or 'this GPU'}: not predicted", "rows": [],
                "notes": [str(n) for n in check.get("notes") or []]}
    achieved = check.get("mfu_achieved")
    title = (f"Prediction check: the replay on this {check['gpu']} ({check['precision']}), predicted at "
             f"MFU {check['mfu_assumed']:g}, measured MFU "
             + ("unavailable" if achieved is None else f"{achieved:.2g}"))
    rows = []
    for row in check["rows"]:
        fmt = _UNITS.get(row["unit"], "{}")
        ratio = row.get("measured_over_predicted")
        rows.append((row["figure"],
                     "-" if row["predicted"] is None else fmt.format(row["predicted"]),
                     "unavailable" if row["measured"] is None else fmt.format(row["measured"]),
                     "-" if ratio is None else f"x{ratio:.2f}"))
    return {"title": title, "rows": rows, "notes": [str(n) for n in check.get("notes") or []]}


def check_markdown(check: PredictionCheck) -> str:
    """The prediction-vs-measurement table and its notes."""
    t = check_table(check)
    lines = [t["title"], ""]
    if t["rows"]:
        lines += ["| | predicted | measured | measured/predicted |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in t["rows"]]
        lines.append("")
    lines += [f"- note: {note}" for note in t["notes"]]
    return "\n".join(lines)
