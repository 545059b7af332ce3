"""The headline says the measured share and what the fix recovers, apart (issue #28, part 4).

"the training loop waits for data (12%)" under "data_wait 79%" read as a contradiction: the
12% was the part the fix recovers. The verdict and each finding line now say both.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.conftest import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "worker_unsafe_loop.py")


def test_verdict_and_finding_lines_say_measured_share_and_recovered_share(tmp_path):
    folder = tmp_path / "run"
    proc = run_cli("run", "--no-timing", "--out", str(folder), "--", sys.executable, SCRIPT, "--steps", "300")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((folder / "report.json").read_text())
    top = next(f for f in report["findings"] if f["severity"] != "info")
    claim = top["claims"][0]
    assert claim["bucket"] == "data_wait"  # batches built in the loop, 2 ms of CPU each
    # the measured share of what the fix works on: the claimed part of the bucket, when it names one
    share = report["breakdown"]["data_wait"] * (claim["part_share"] if claim["part"] else 1.0)
    bucket = f"data_wait ({claim['part'].replace('_', ' ')})" if claim["part"] else "data_wait"
    recovered = f"{100 * top['waste_fraction']:.0f}%"
    verdict = report["verdict"]
    said = re.search(re.escape(bucket) + r" is (\d+)% of wall time; the fix recovers (\d+)% of wall time on this "
                     "machine", verdict)
    assert said is not None, verdict
    assert abs(int(said[1]) - 100 * share) <= 1 and f"{said[2]}%" == recovered  # the report's figures rounded
    assert "Healthy" not in verdict  # a large measured wait is never a clean bill, even when no fix helps here
    line = next(line for line in proc.stderr.splitlines() if line.strip().startswith(f"[{top['severity']}] "))
    assert f"{bucket} {said[1]}% measured; the fix recovers {recovered} of wall time" in line, line


@pytest.mark.parametrize(("wait", "part_s", "removed"), [
    (0.61496, None, 0.64),  # the report's 0.615 reads 62% on the finding's line; unrounded, 61%
    (0.61504, None, 0.6449996),
    (0.2549996, None, 0.0649996),  # the recovered share at its edge: 0.065 in the report
    (0.5, 0.30007, 0.2),  # a part of the bucket: its share and the part's, each as the report has them
])
def test_the_verdict_and_the_finding_line_say_one_figure_at_a_rounding_edge(
        wait: float, part_s: float | None, removed: float) -> None:
    """CI: the verdict said one percentage and the finding's line, read through report.json's four
    decimals, another. Both now say the figures as the report writes them."""
    from gpudoctor.render.terminal import _measured
    from gpudoctor.report.build import breakdown_section
    from gpudoctor.report.verdict import Verdict, verdict
    from gpudoctor.rules.account import claim
    from gpudoctor.rules.base import Finding, Fix

    shares = {"startup": 0.1, "data_wait": wait, "compute": 0.9 - wait, "checkpoint": 0.0, "eval": 0.0, "other": 0.0}
    f = Finding(rule="data_stall", title="The training loop waits for data", evidence="", fix=Fix(summary=""),
                claims=[claim("data_wait", removed, wait, part="loader" if part_s else "", part_s=part_s)],
                severity="high", waste_fraction=removed)
    said = re.search(r"is (\d+)% of wall time; the fix recovers (\d+)%", verdict(Verdict([f], removed, True,
                                                                                          share=shares.__getitem__)))
    assert said is not None
    line = _measured(f.to_dict(None), breakdown_section(shares))  # type: ignore[arg-type]
    assert line.endswith(f" {said[1]}% measured; ")
    assert f"{100 * f.to_dict(None)['waste_fraction']:.0f}" == said[2]
