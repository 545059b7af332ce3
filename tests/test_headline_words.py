"""The headline says the measured share and what the fix recovers, apart (issue #28, part 4).

"the training loop waits for data (12%)" under "data_wait 79%" read as a contradiction: the
12% was the part the fix recovers. The verdict and each finding line now say both.
"""

from __future__ import annotations

import json
import sys

from tests.conftest import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "worker_unsafe_loop.py")


def test_verdict_and_finding_lines_say_measured_share_and_recovered_share(tmp_path):
    folder = tmp_path / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, SCRIPT, "--steps", "300")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((folder / "report.json").read_text())
    top = next(f for f in report["findings"] if f["severity"] != "info")
    bucket = top["claims"][0]["bucket"]
    assert bucket == "data_wait"  # batches built in the loop, 2 ms of CPU each
    measured = f"{100 * report['breakdown'][bucket]:.0f}%"
    recovered = f"{100 * top['waste_fraction']:.0f}%"
    verdict = report["verdict"]
    assert f"{bucket} is {measured} of wall time; the fix recovers {recovered} of wall time on this machine" \
        in verdict, verdict
    line = next(line for line in proc.stderr.splitlines() if line.strip().startswith(f"[{top['severity']}]"))
    assert f"{bucket} {measured} measured; the fix recovers {recovered} of wall time" in line, line
