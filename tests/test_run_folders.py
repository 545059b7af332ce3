"""Run folders over a folder's life: unique default names, a reused --out, two trainings in
one folder, and a full disk (issue 12, findings 7 and the full-disk items)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.launch.recorder import default_out
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import ReportOptions, build_report
from tests.conftest import ROOT, gpudoctor_cmd, run_cli
from tests.recording_builder import T0, RecordingBuilder

TINY = str(ROOT / "tests" / "scripts" / "tiny_loop.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _doctor_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("gpudoctor: ")]


def _count_steps(folder: Path) -> dict[int, int]:
    counts = {}
    for path in (folder / "events").glob("*.jsonl"):
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        if any(r.get("k") == "step" for r in rows):
            counts[int(path.stem)] = sum(r.get("k") == "step" for r in rows)
    return counts


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


# -- two trainings in one folder ----------------------------------------------------------

def test_two_trainings_in_a_row_under_one_run_are_both_counted(tmp_path):
    out = tmp_path / "run"
    wrapper = f"{sys.executable} {TINY} --seconds 1.5 && {sys.executable} {TINY} --seconds 1.5"
    proc = run_cli("run", "--out", str(out), "--", "sh", "-c", wrapper)
    assert proc.returncode == 0, proc.stderr
    assert "could not build the report" not in proc.stderr, proc.stderr
    steps = _count_steps(out)
    assert len(steps) == 2, steps  # two training processes, both rank 0
    report = json.loads((out / "report.json").read_text())
    assert report["steps"]["count"] == sum(steps.values())
    assert sorted(r["pid"] for r in report["per_rank"]) == sorted(steps)
    assert all(f["rule"] != "straggler_rank" for f in report["findings"])


def _sequential(builder: RecordingBuilder, pid: int, rank: int | None, born_s: float, steps: int,
                wait_s: float, *, exit_s: float) -> None:
    rows = builder.events.setdefault(pid, [])
    rows.append({"k": "proc", "t": T0 + born_s, "pid": pid, "ppid": 1, "rank": rank, "is_worker": False,
                 "create_time": T0 + born_s, "libs": {"torch": "2.13.0"}, "argv": ["python", "train.py"]})
    end = builder.training_loop(rows, start_s=born_s + 2.0, steps=steps, compute_s=0.1 - wait_s, wait_s=wait_s)
    rows.append({"k": "exit", "t": T0 + max(end, exit_s)})


def _report(builder: RecordingBuilder) -> dict:
    builder.host_rows(cpu_total_pct=30.0, cpu_proc_pct=100.0)
    return build_report(load_recording(builder.write()), ReportOptions())


def test_two_sequential_trainings_aggregate_like_one(tmp_path):
    """Two rank-0 processes one after the other: every step counted, the second's compute is not
    the first's 'other' time, and no straggler from a rank compared with itself."""
    b = RecordingBuilder(tmp_path / "run", duration_s=100.0)
    _sequential(b, 100, None, 0.0, 450, 0.02, exit_s=48.0)
    _sequential(b, 200, None, 50.0, 450, 0.02, exit_s=98.0)
    report = _report(b)
    assert report["steps"]["count"] == 900
    assert report["steps"]["step_time_s"]["p50"] == pytest.approx(0.1, rel=0.01)  # no 4 s gap between runs
    bd = report["breakdown"]
    assert bd["compute"] == pytest.approx(0.72, abs=0.03)  # 2 x 45 s of 80% compute over 100 s
    assert bd["data_wait"] == pytest.approx(0.18, abs=0.03)
    assert bd["startup"] == pytest.approx(0.04, abs=0.02)
    assert sum(bd.values()) == pytest.approx(1.0, abs=1e-6)
    assert all(f["rule"] != "straggler_rank" for f in report["findings"])


def test_straggler_compares_only_ranks_that_ran_together(tmp_path):
    """Two DDP generations in a row: the second has a slow rank 1; the first generation's rank 1
    (balanced) is another process and must not dilute or hide it."""
    b = RecordingBuilder(tmp_path / "run", duration_s=100.0)
    _sequential(b, 100, 0, 0.0, 450, 0.02, exit_s=48.0)
    _sequential(b, 101, 1, 0.0, 450, 0.02, exit_s=48.0)
    _sequential(b, 200, 0, 50.0, 450, 0.02, exit_s=98.0)
    _sequential(b, 201, 1, 50.0, 450, 0.07, exit_s=98.0)
    report = _report(b)
    straggler = next(f for f in report["findings"] if f["rule"] == "straggler_rank")
    assert "Rank 1" in straggler["title"]
    data = straggler["data"]  # the second generation's rank 1 alone: 70 ms, not 45 ms mixed with the first's
    assert data["rank"] == 1
    assert data["wait_per_step_s"] == pytest.approx(0.07, abs=0.005)
    assert data["others_wait_per_step_s"] == pytest.approx(0.02, abs=0.005)


def test_two_side_by_side_trainings_with_one_rank_are_not_ranks_of_one_job(tmp_path):
    """Two unrelated trainings at once, neither with RANK set: both counted, no straggler."""
    b = RecordingBuilder(tmp_path / "run", duration_s=100.0)
    _sequential(b, 100, None, 0.0, 900, 0.02, exit_s=98.0)
    _sequential(b, 200, None, 0.0, 900, 0.07, exit_s=98.0)
    report = _report(b)
    assert sorted(r["pid"] for r in report["per_rank"]) == [100, 200]
    assert all(f["rule"] != "straggler_rank" for f in report["findings"])


# -- folder names and a reused --out ---------------------------------------------------------

def test_default_folder_names_are_unique_within_one_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folders = [default_out("run") for _ in range(5)]  # well within one second
    assert len(set(folders)) == 5
    for folder in folders:
        assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_two_runs_started_together_get_two_folders(tmp_path):
    procs = [subprocess.Popen(gpudoctor_cmd("run", "--", sys.executable, "-c", "pass"), cwd=tmp_path,
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    folders = sorted((tmp_path / "reports").iterdir())
    assert len(folders) == 3, folders
    pids = {json.loads((f / "meta.json").read_text())["pid"] for f in folders}
    assert len(pids) == 3 and all((f / "report.json").is_file() for f in folders)


def test_a_reused_out_starts_fresh_and_keeps_the_earlier_recording(tmp_path):
    out = tmp_path / "run"
    first = run_cli("run", "--out", str(out), "--", sys.executable, TINY, "--seconds", "1")
    assert first.returncode == 0, first.stderr
    first_pids = set(_count_steps(out))
    second = run_cli("run", "--out", str(out), "--", sys.executable, "-c", "print('second')")
    assert second.returncode == 0, second.stderr
    assert any("--out" in ln and "earlier recording" in ln for ln in _doctor_lines(second.stderr)), second.stderr
    assert _count_steps(out) == {}  # the first run's events are not mixed in
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["command"][-1] == "print('second')" and report["steps"]["count"] == 0
    (kept,) = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert set(_count_steps(kept)) == first_pids and first_pids
    assert json.loads((kept / "report.json").read_text())["steps"]["count"] > 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700


def test_an_out_in_use_by_another_doctor_is_refused(tmp_path):
    out, go = tmp_path / "run", tmp_path / "go"
    waiter = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    first = subprocess.Popen(gpudoctor_cmd("run", "--out", str(out), "--", sys.executable, "-c", waiter),
                             env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "meta.json").exists(), "the first doctor's meta.json")
        second = run_cli("run", "--out", str(out), "--", sys.executable, "-c", "pass")
        lines = _doctor_lines(second.stderr)
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert "--out" in lines[0] and str(out) in lines[0] and "another gpudoctor" in lines[0]
    finally:
        go.touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == "finished" and not [p for p in out.iterdir() if p.name.startswith("previous-")]


# -- a full disk -----------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here to fill up (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_exits_with_the_trainings_code_and_leaves_no_empty_report(tiny_disk):
    out = tiny_disk / "run"
    proc = run_cli("run", "--out", str(out), "--", sys.executable, TINY, "--seconds", "2")
    assert "step 1" in proc.stdout  # the training ran to the end
    assert proc.returncode == 0, proc.stderr  # the training's code, not the doctor's trouble
    assert "Traceback" not in proc.stderr, proc.stderr
    last = _doctor_lines(proc.stderr)[-1]
    assert "--out" in last and "training exited with 0" in last, proc.stderr
    for path in out.rglob("*"):
        assert not path.name.endswith(".tmp"), path  # no temp file left behind
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            if path.name.startswith("report."):
                assert path.stat().st_size > 0, path  # never an empty report



def test_a_training_started_as_another_ended_is_not_read_as_beside_it():
    """psutil's start time is off by up to ~0.7 s: an overlap that small is sequential."""
    from gpudoctor.analysis.trainings import group

    assert group({1: (0.0, 10.0), 2: (9.4, 20.0)}) == [[1], [2]]
    assert group({1: (0.0, 10.0), 2: (5.0, 20.0)}) == [[1, 2]]
