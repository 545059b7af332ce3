"""``gpudoctor try`` on a hand-written loop's saves: the interval is the script's code, so the trial
thins its ``torch.save`` calls (keeps every k-th) and measures what ``save_steps × k`` gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.analysis import analyze
from gpudoctor.analysis.saves import split_saves
from gpudoctor.recording.store import load_recording
from tests.conftest import PROBES, ROOT, run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)


def test_try_sets_a_save_interval_through_the_scripts_own_flag(tmp_path: Path) -> None:
    """A loop whose interval is a flag (--save-every): the trial runs the command with the finding's
    value, as ``run`` prescribes it (one knob, one value: #40), and saves that often, into its own copy
    of the checkpoint folder the baseline made (the baseline's left as it was)."""
    out, ckpts = tmp_path / "try", tmp_path / "ckpts"
    proc = run_cli("try", "--out", str(out), "--seconds", "7", "--pairs", "1", "--fix", "checkpoint_overhead", "--",
                   "python", str(PROBES / "fsync_checkpoints.py"), "--steps", "300", "--n-embd", "128",
                   "--out-dir", str(ckpts), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    finding = next(f for f in report["findings"] if f["rule"] == "checkpoint_overhead")
    save_steps = finding["fix"]["config"]["save_steps"]
    assert finding["data"]["current_save_steps"] == 1
    trial = report["trial"]
    assert trial["values"] == {"command_line": {"--save-every": save_steps}} and trial["complete"] is True
    assert trial["predicted_speedup"] == pytest.approx(finding["predicted_speedup"], abs=1e-3)
    assert trial["pairs"] is None  # one pair (--pairs 1): the speedup is its two rates' ratio
    assert trial["achieved_speedup"] == pytest.approx(trial["trial_steps_per_s"] / trial["baseline_steps_per_s"],
                                                      abs=1e-3)
    assert f"--save-every {save_steps}" in proc.stderr  # the trial's command, said before it runs
    a = analyze(load_recording(out / "trial"))
    p = a.primary
    assert p is not None and len(p.step_times) >= 3
    assert len(split_saves(p).checkpoints) <= len(p.step_times) // save_steps + 1
    # the checkpoint folder the baseline made is the baseline's: the trial saved into its own
    [moved] = trial["trial_run"]["outputs"]
    assert (moved["argument"], moved["kind"], moved["baseline"]) == (str(ckpts), "folder", "created")
    assert moved["trial"].startswith("trial/outputs/") and f"--out-dir {out / moved['trial']}" in proc.stderr
    assert any("trial wrote its own under trial/outputs/" in n for n in trial["notes"])

    def steps(folder: Path) -> list[int]:
        return sorted(int(f.stem.split("-")[1]) for f in folder.glob("checkpoint-*.pt"))

    assert steps(out / moved["trial"]) and all(s % save_steps == 0 for s in steps(out / moved["trial"]))
    # the baseline's last two (three when it was stopped between a save and its rotation), a step apart:
    # it saved every step, and nothing rotated them since
    base = steps(ckpts)
    assert len(base) in (2, 3) and all(b - a == 1 for a, b in zip(base, base[1:], strict=False))


def test_try_thins_a_loops_saves_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "try"
    proc = run_cli("try", "--out", str(out), "--seconds", "7", "--pairs", "1", "--fix", "checkpoint_overhead", "--",
                   "python", str(ROOT / "tests" / "scripts" / "save_each_step.py"), timeout=600)
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


def test_a_thinned_save_leaves_the_last_checkpoint_where_the_loop_looks(tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A loop that saves each step and then fsyncs, reads and rotates what it saved: ``try`` skipped
    the save and the loop's next line opened a missing file (FileNotFoundError, issue #40). Every
    skipped save's path now holds the last real checkpoint (a hard link: no bytes written)."""
    import os

    import torch

    import gpudoctor
    from gpudoctor import hooks
    from gpudoctor.hooks import apply

    spec = {"schema": apply.SCHEMA, "rule": "checkpoint_overhead", "torch_save": {"keep_every": 3}}
    monkeypatch.setattr(apply, "_overrides", apply.Overrides(spec))  # what GPUDOCTOR_APPLY's file gives
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05):
        monkeypatch.setattr(apply, "_writer", hooks.writer())
        for step in range(1, 8):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            path = ckpt / f"step-{step}.pt"
            torch.save({"step": step, "model": model.state_dict()}, path)
            fd = os.open(path, os.O_RDONLY)  # the loop finishes its save...
            os.fsync(fd)
            os.close(fd)
            assert torch.load(path)["model"].keys() == model.state_dict().keys()
            if step > 2:
                os.remove(ckpt / f"step-{step - 2}.pt")  # ...and keeps the last two
    o = apply._overrides
    assert o is not None and (o.saves_seen, o.saves_skipped, o.stand_ins) == (7, 4, 4)
    steps_written = [torch.load(ckpt / f"step-{s}.pt")["step"] for s in (6, 7)]
    assert steps_written == [4, 7]  # kept: the 1st, 4th and 7th; the 6th stands in with the 4th's
