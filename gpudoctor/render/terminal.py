"""The terminal's few lines about a finished report (stderr: stdout stays the patient's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpudoctor.common.termtext import say
from gpudoctor.core.schema import Breakdown, Finding, Report
from gpudoctor.render.base import NO_GPU, cpu_text, fmt_pct, has_gpu, mfu_text, num, outcome_text


def summary_lines(report: Report, folder: Path) -> list[str]:
    """What the user reads first: how the command ended (when it did not simply finish), the
    verdict, where the time went, the busy shares, each problem (notes are for the report), and
    where the report is."""
    run = report.get("run") or {}
    b = report["breakdown"]
    lines = []
    outcome = outcome_text(run)
    if outcome:
        lines.append(f"gpudoctor: {outcome}.")
    lines.append(f"gpudoctor: {report['verdict']}")
    if b.get("compute") is not None:
        parts = ", ".join(f"{k} {100 * (num(v) or 0):.0f}%" for k, v in b.items() if (num(v) or 0) >= 0.005)
        lines.append(f"  wall time {run['duration_s']:.1f} s: {parts}")
    shares = report.get("shares") or {}
    gpu = f"GPU busy {fmt_pct(shares.get('gpu_busy'), 0)}" if has_gpu(run) else NO_GPU
    if shares.get("cpu_busy") is not None:
        lines.append(f"  {gpu}; CPU busy {cpu_text(shares['cpu_busy'], run)} (the training processes)")
    else:
        lines.append(f"  {gpu}")
    g = report.get("gpu_timeline")
    clock = (f"GPU busy {fmt_pct(g.get('busy_fraction'), 0)} of its step time (CUDA events); "
             if isinstance(g, dict) else "")
    lines.append(f"  {clock}MFU {mfu_text(report.get('mfu'))}")
    for f in report["findings"]:
        if f["severity"] == "info":
            continue
        if f.get("risk"):  # a risk with a deadline (memory_growth), not wasted time
            lines.append(f"  [{f['severity']}] {f['rule']}: a risk, not a waste — {f['fix']['summary']}")
            continue
        usd = f["waste_usd_per_hour"]
        money = f", ${usd:.2f}/h" if usd is not None else ""
        lines.append(f"  [{f['severity']}] {f['rule']}: {_measured(f, b)}the fix recovers "
                     f"{100 * f['waste_fraction']:.0f}% of wall time{money} — {f['fix']['summary']}")
    lines.append(f"  report: {folder / 'report.html'}")
    return lines


def _measured(finding: Finding, breakdown: Breakdown) -> str:
    """``data_wait 79% measured; `` for the bucket the finding's fix claims, "" when unknown."""
    claims = finding.get("claims") or []
    if not claims:
        return ""
    first = claims[0]
    bucket, part = first["bucket"], first.get("part")
    share = breakdown.get(bucket)
    if share is None or share <= 0:
        return ""
    if part:
        return f"{bucket} ({part.replace('_', ' ')}) {100 * share * first['part_share']:.0f}% measured; "
    return f"{bucket} {100 * share:.0f}% measured; "


def print_summary(report: Report, folder: Path, as_json: bool) -> None:
    """A short summary on stderr (stdout stays the patient's), or JSON on stdout."""
    if as_json:
        say(json.dumps(report, indent=2), file=sys.stdout)
        return
    say("\n" + "\n".join(summary_lines(report, folder)), file=sys.stderr)
