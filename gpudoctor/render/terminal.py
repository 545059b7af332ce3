"""The terminal's few lines about a finished report (stderr: stdout stays the patient's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def print_summary(report: dict[str, Any], folder: Path, as_json: bool) -> None:
    """A short summary on stderr (stdout stays the patient's), or JSON on stdout."""
    if as_json:
        print(json.dumps(report, indent=2))
        return
    out = sys.stderr
    b = report["breakdown"]
    print(f"\ngpudoctor: {report['verdict']}", file=out)
    if b.get("compute") is not None:
        parts = ", ".join(f"{k} {100 * (v or 0):.0f}%" for k, v in b.items() if (v or 0) >= 0.005)
        print(f"  wall time {report['run']['duration_s']:.1f} s: {parts}", file=out)
    for f in report["findings"]:
        if f["severity"] == "info":
            continue
        usd = f["waste_usd_per_hour"]
        money = f", ${usd:.2f}/h" if usd is not None else ""
        print(f"  [{f['severity']}] {f['rule']}: {100 * f['waste_fraction']:.0f}% waste{money} — {f['fix']['summary']}", file=out)
    print(f"  report: {folder / 'report.html'}", file=out)
