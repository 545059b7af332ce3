"""A crash through the doctor's own code is said as the doctor's, never the command's (issue #39).

Real runs under ``gpudoctor run`` of tests/scripts/doctor_fault_loop.py: the terminal (under the
traceback and in the verdict) and the report name the doctor's frame, call it gpudoctor's bug when the
exception came from our code, and say how to run without the hooks; a crash that only passed through
a wrapper of ours says how to tell; the script's own crash says nothing of the kind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.render.markdown import MarkdownRenderer
from tests.conftest import ROOT, cli, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "doctor_fault_loop.py")


def _run(tmp: Path, *args: str) -> tuple[dict[str, Any], str]:
    folder = tmp / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, SCRIPT, *args)
    assert proc.returncode == 1, proc.stderr[-2000:]  # the command's own exit code, as bare
    gate = cli("check", str(folder), "--max-waste", "0.99")  # the CI gate says it too
    assert gate.returncode == 1
    return json.loads((folder / "report.json").read_text()), proc.stderr + gate.stderr


@pytest.mark.parametrize("how", ["--ours", "--through", "--own"])
def test_a_crash_through_the_doctors_code_is_said_as_the_doctors(tmp_path: Path, how: str) -> None:
    report, stderr = _run(tmp_path, *([how] if how != "--own" else []))
    run, verdict = report["run"], report["verdict"]
    assert run["status"] == "crashed" and verdict.startswith("Crashed (exit code 1) after 3 training steps")
    fault = run.get("doctor_fault")
    markdown = MarkdownRenderer().render(report)
    if how == "--own":
        assert fault is None and "gpudoctor's" not in stderr and "GPUDOCTOR_HOOKS" not in verdict
        return
    assert fault is not None and fault["raised"] is (how == "--ours")
    hook = fault["frames"][-1 if how == "--ours" else 0]  # the one that raised; else the one entered
    assert hook.startswith("gpudoctor/hooks/torch_hooks.py:") and hook.endswith(" in save")
    for text in (stderr, verdict, markdown):
        assert "gpudoctor's bug" in text and "GPUDOCTOR_HOOKS=0" in text and hook in text
        assert ("does not fail with GPUDOCTOR_HOOKS=0" in text) is (how == "--through")
    assert f"gpudoctor: {verdict}" in stderr  # the verdict printed at the end says it too
    under_traceback = stderr[stderr.index("Traceback"):]
    assert "gpudoctor: the training crashed in gpudoctor's own hook" in under_traceback or how == "--through"


class _Events:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.rows.append(event)


@pytest.mark.parametrize("last", ["gpudoctor/hooks/torch_hooks.py", "/home/me/train.py"])
def test_a_dataloader_workers_traceback_carried_as_text_is_read_for_our_frames(last: str) -> None:
    """A worker's exception reaches the main process as text: its frames count, the last one raised."""
    from gpudoctor.hooks import crash

    ours = str(ROOT / "gpudoctor" / "hooks" / "torch_hooks.py")
    raised = str(ROOT / last) if last.startswith("gpudoctor") else last
    text = ("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            f'  File "{ours}", line 10, in fetch\n    x\n  File "{raised}", line 20, in here\n    y\n'
            "ValueError: boom")
    events = _Events()
    said = crash._record(events, ValueError, ValueError(text), None)  # type: ignore[arg-type]
    (event,) = events.rows
    assert event["doctor_frames"][0] == "gpudoctor/hooks/torch_hooks.py:10 in fetch"
    assert event["doctor_raised"] is last.startswith("gpudoctor") and "GPUDOCTOR_HOOKS=0" in said
