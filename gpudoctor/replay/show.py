"""``python -m gpudoctor.replay.show CONFIG MEASURE.json [--target GPU] [--mfu X] [--json]``

Print a preflight prediction as a before/after Markdown table, for a person
reading it in a terminal or pasting it into a pull request. The report's own
renderers are separate; this is the quick look.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpudoctor.errors import UserError

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


def table(prediction: dict[str, Any]) -> dict[str, Any]:
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


def markdown(prediction: dict[str, Any]) -> str:
    """The before/after table, the fixes and the notes."""
    t = table(prediction)
    lines = [t["title"], "", "| | before | after fixes |", "|---|---|---|"]
    lines += [f"| {label} | {b} | {a} |" for label, b, a in t["rows"]]
    lines.append("")
    lines += [f"- fix ({fx})" for fx in t["fixes"]]
    lines += [f"- note: {note}" for note in t["notes"]]
    return "\n".join(lines)


_UNITS = {"s": "{:.4f} s", "fraction": "{:.1%}", "per_s": "{:,.1f}"}


def check_table(check: dict[str, Any]) -> dict[str, Any]:
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


def check_markdown(check: dict[str, Any]) -> str:
    t = check_table(check)
    lines = [t["title"], ""]
    if t["rows"]:
        lines += ["| | predicted | measured | measured/predicted |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in t["rows"]]
        lines.append("")
    lines += [f"- note: {note}" for note in t["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpudoctor.replay.show", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("config")
    parser.add_argument("measure", help="replay_measure.json written by the worker")
    parser.add_argument("--target", default=None)
    parser.add_argument("--mfu", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    args = parser.parse_args(argv)
    try:
        from gpudoctor.replay.config import load_config
        from gpudoctor.replay.preflight import predict

        with open(args.measure, encoding="utf-8") as fh:
            measure = json.load(fh)
        prediction = predict(load_config(args.config), measure, target=args.target, mfu=args.mfu)
    except UserError as exc:
        print(f"gpudoctor: {exc}", file=sys.stderr)
        return exc.exit_code
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gpudoctor: cannot read {args.measure}: {exc.__class__.__name__}", file=sys.stderr)
        return 2
    print(json.dumps(prediction, indent=1) if args.json else markdown(prediction))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
