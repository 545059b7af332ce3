"""The diff's words: its notes and its one-line summary, from :func:`gpudoctor.report.diff.diff_reports`'
figures alone, and the ``gpudoctor.diff/2`` JSON that carries them beside the figures.

:mod:`gpudoctor.report.diff` computes (seconds per step, verdicts against the noise, what happened to
each finding); this module only words what it found, so a sentence changes here without touching a
figure, and the Markdown, HTML and JSON say the same.
"""

from __future__ import annotations

import json
from typing import Any

from gpudoctor.common.wording import SPAN_LABELS, bucket_text, fmt_seconds, fmt_usd
from gpudoctor.core.schema import SECTIONS, Diff


def diff_json(d: Diff) -> str:
    """``gpudoctor diff -o diff.json``: the figures, then their ``notes`` and ``summary``."""
    return json.dumps(worded(d), indent=2)


def worded(d: Diff) -> dict[str, Any]:
    """The figures with their ``notes`` and ``summary`` added, as the JSON and the HTML page read them."""
    return {**d, "notes": notes(d), "summary": summary_line(d)}


def notes(d: Diff) -> list[str]:
    """What makes the comparison less than like for like, then where findings shared a fall."""
    return comparability_notes(d) + shared_fall_notes(d["findings"])


def comparability_notes(d: Diff) -> list[str]:
    """Warnings that make the comparison less than like for like."""
    out = []
    b_gpus, a_gpus = d["before"]["gpus"], d["after"]["gpus"]
    if b_gpus != a_gpus:
        out.append(f"The runs used different hardware: {b_gpus} before, {a_gpus} after.")
    for label, run in (("before", d["before"]), ("after", d["after"])):
        status = run["status"]
        if status not in (None, "finished"):
            out.append(f"The {label} run is {status}; its figures cover only what was recorded.")
    for label in ("before", "after"):
        method = d["noise"][label]["method"]
        if method == "unavailable":
            out.append(f"The {label} run has no step times: its noise, and every change measured "
                       "against it, is unavailable.")
        elif method == "p50_p90":
            out.append(f"The {label} report holds no step timestamps: its noise comes from the p50 "
                       "and p90 step times only, without the drift over the run.")
    b_sections, a_sections = d["sections"]["before"], d["sections"]["after"]
    for s in SECTIONS:
        if (s.key in b_sections) != (s.key in a_sections):
            side, other = ("before", "after") if s.key in b_sections else ("after", "before")
            out.append(f"Only the {side} report has the {s.title} ({s.written_by}); the {other} "
                       "has none, so it is not compared.")
    startup = d["breakdown"].get("startup")
    if startup is not None and (startup["before"] or startup["after"]):
        out.append("Startup is one launch per run: its own noise cannot be observed, so it is "
                   "held to the steps' relative noise.")
    return out


def shared_fall_notes(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Where two findings no longer reported claimed the same bucket, its fall is credited to each
    (up to its own seconds): which fix removed which seconds is not observable."""
    by_bucket: dict[str, list[str]] = {}
    for f in found["resolved"] + found["partial"]:
        if f["bucket"]:
            by_bucket.setdefault(f["bucket"], []).append(f["rule"])
    return [
        f"{', '.join(rules)} all lived in {SPAN_LABELS.get(b, b)}: its fall is credited to each, "
        "as which fix removed which seconds cannot be told apart."
        for b, rules in by_bucket.items() if len(rules) > 1
    ]


def summary_line(d: Diff) -> str:
    """One line of conclusions, all from seconds: speed, resolved/relabelled/new rules."""
    parts = []
    step, t = d["step_time_p50_s"], d["noise"]["threshold_s_per_step"]
    ratio = d["throughput_steps_per_s"].get("ratio")
    if step["verdict"] in ("better", "worse") and ratio:
        parts.append(
            f"steps {ratio:.2f}× as fast" if ratio >= 1 else f"steps {1 / ratio:.2f}× slower"
        )
    elif step["verdict"] == "within_noise":
        parts.append(
            f"step time unchanged within noise ({fmt_seconds(step['before'])} → "
            f"{fmt_seconds(step['after'])}, noise ±{fmt_seconds(t)})"
        )
    else:
        parts.append("step time unavailable")
    found = d["findings"]
    if found["resolved"]:
        parts.append("resolved " + ", ".join(f["rule"] for f in found["resolved"]))
    if found["partial"]:
        parts.append("partly resolved " + ", ".join(f["rule"] for f in found["partial"]))
    for f in found["moved"]:
        parts.append(f"relabelled: {f['rule']} → {', '.join(f['moved_to'])}, " + bucket_text(f))
    if found["gone"]:
        parts.append("no longer reported, not confirmed by seconds: "
                     + ", ".join(f["rule"] for f in found["gone"]))
    if found["new"]:
        parts.append("new " + ", ".join(f["rule"] for f in found["new"]))
    usd = d["wasted_usd_per_hour"]
    if usd["before"] is not None and usd["after"] is not None:
        parts.append(f"wasted {fmt_usd(usd['before'])}/h → {fmt_usd(usd['after'])}/h")
    return "; ".join(parts)
