"""A run that crashed is said to have crashed, and ``check`` fails it (issue #28, part 5).

The script (tests/scripts/crash_loop.py) trains a few steps of a real loop and raises. Its
report covers what ran, and says so; nothing in it reads as a clean bill of health.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "crash_loop.py")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    folder = tmp_path_factory.mktemp("crash") / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, SCRIPT, "--crash-at", "20")
    assert proc.returncode == 1, proc.stderr[-2000:]  # the command's own exit code
    return json.loads((folder / "report.json").read_text()), folder, proc.stderr


def test_the_verdict_of_a_crashed_run_says_it_crashed_and_what_it_covers(crashed):
    report, _, stderr = crashed
    assert report["run"]["status"] == "crashed"
    verdict = report["verdict"]
    assert verdict.startswith("Crashed (exit code 1) after 19 training steps"), verdict
    assert "Healthy" not in verdict
    assert "what ran before the crash" in verdict
    assert f"gpudoctor: {verdict}" in stderr


def test_check_fails_a_crashed_run_unless_told_to_gate_what_ran(crashed):
    _, folder, _ = crashed
    failed = cli("check", str(folder), "--max-waste", "0.99")
    assert failed.returncode == 1
    assert "crashed (exit code 1)" in failed.stderr
    allowed = cli("check", str(folder), "--max-waste", "0.99", "--allow-crash")
    assert allowed.returncode == 0, allowed.stderr
