"""``gpudoctor try`` on a hand-written loop's saves: the interval is the script's code, so the trial
thins its ``torch.save`` calls (keeps every k-th) and measures what ``save_steps × k`` gives."""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.analysis import analyze
from gpudoctor.analysis.saves import split_saves
from gpudoctor.recording.store import load_recording
from tests.conftest import PROBES, run_cli


def test_try_thins_a_loops_saves_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "try"
    proc = run_cli("try", "--out", str(out), "--seconds", "12", "--fix", "checkpoint_overhead", "--",
                   "python", str(PROBES / "fsync_checkpoints.py"), "--steps", "300", "--n-embd", "128",
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    finding = next(f for f in report["findings"] if f["rule"] == "checkpoint_overhead")
    save_steps = finding["fix"]["config"]["save_steps"]
    assert finding["data"]["current_save_steps"] == 1
    trial = report["trial"]
    # the one value: the finding's save_steps, run as every save_steps-th save of a loop that saved each step
    assert trial["values"] == {"torch_save": {"keep_every": save_steps}}
    assert [a["call"] for a in trial["applied"]] == ["torch.save"]
    assert any("thinned its torch.save calls" in n for n in trial["notes"])
    assert trial["predicted_speedup"] is not None and trial["achieved_speedup"] is not None
    # the trial really skipped them: at most one save kept per save_steps steps
    a = analyze(load_recording(out / "trial"))
    p = a.primary
    assert p is not None and len(p.step_times) >= 3
    assert len(split_saves(p).checkpoints) <= len(p.step_times) // save_steps + 1
    base = analyze(load_recording(out)).primary
    assert base is not None and len(split_saves(base).checkpoints) >= len(base.step_times) - 1
