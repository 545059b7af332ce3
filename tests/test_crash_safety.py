"""SIGKILL at random moments: the doctor or the training dies, the recording survives.

What was recorded up to about a second before the kill is on disk, and
``gpudoctor report`` renders it, saying when the recording is partial.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, gpudoctor_cmd, run_cli

TINY = str(ROOT / "tests" / "scripts" / "tiny_loop.py")
LOSS_S = 1.0  # the promise: at most about a second of samples lost
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _doctor(folder: Path, seconds: float, stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(gpudoctor_cmd("run", "--out", str(folder), "--", sys.executable, TINY,
                                          "--seconds", str(seconds)),
                            stdout=stdout, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT)


def _wait_for(path: Path, timeout_s: float = 20.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return time.time()


def _last_t(path: Path, key: str = "t") -> float | None:
    """The latest time in a JSON-lines file, reading lines the way a loader must (last may be cut)."""
    times = []
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row.get(key), float):
            times.append(row[key])
    return max(times) if times else None


# Seeded: the same "random" moments on every run, spread over startup, training and the end.
_RNG = random.Random(6)
KILL_AFTER_S = sorted(round(_RNG.uniform(0.2, 5.0), 2) for _ in range(4))


@pytest.mark.parametrize("delay_s", KILL_AFTER_S)
def test_sigkill_of_the_doctor_keeps_what_it_recorded(tmp_path, delay_s):
    folder = tmp_path / "run"
    doctor = _doctor(folder, seconds=1.5)
    started = _wait_for(folder / "meta.json")  # sampling starts right after meta.json is written
    time.sleep(delay_s)
    killed_at = time.time()
    doctor.send_signal(signal.SIGKILL)
    doctor.wait(timeout=10)
    patient = json.loads((folder / "meta.json").read_text())["pid"]
    if psutil.pid_exists(patient):  # the training is not hurt: it runs on (we stop it to save time)
        assert psutil.Process(patient).status() != psutil.STATUS_ZOMBIE
        psutil.Process(patient).kill()
        psutil.wait_procs([psutil.Process(patient)], timeout=10)

    proc = run_cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((folder / "report.json").read_text())
    meta = json.loads((folder / "meta.json").read_text())
    if meta["status"] == "running":  # killed before the end: said so
        assert report["run"]["status"] == "partial"
        assert any("partial" in n for n in report["notes"]), report["notes"]
        assert any(f["rule"] == "partial_recording" for f in report["findings"])
    if killed_at - started >= LOSS_S:
        last = _last_t(folder / "samples" / "host.jsonl")
        assert last is not None and last >= killed_at - LOSS_S - 0.2, (last, killed_at)
    assert "<html" in (folder / "report.html").read_text().lower()


def test_sigkill_of_the_training_process_gets_a_crashed_report(tmp_path):
    folder = tmp_path / "run"
    doctor = _doctor(folder, seconds=60, stdout=subprocess.PIPE)
    assert doctor.stdout is not None
    assert doctor.stdout.readline().startswith("step")  # training has begun
    time.sleep(random.Random(7).uniform(0.5, 1.5))
    patient = psutil.Process(json.loads((folder / "meta.json").read_text())["pid"])
    killed_at = time.time()
    patient.kill()
    doctor.communicate(timeout=60)
    assert doctor.returncode == 128 + signal.SIGKILL  # the training's fate, as a shell reports it

    report = json.loads((folder / "report.json").read_text())  # written by the doctor
    assert report["run"]["status"] == "crashed" and report["run"]["exit_code"] == 137
    assert report["steps"]["count"] > 0 and report["breakdown"]["compute"] > 0
    events = next((folder / "events").glob("*.jsonl"))
    last_step = max(json.loads(x)["t"] for x in events.read_text().splitlines() if '"k":"step"' in x)
    assert last_step >= killed_at - LOSS_S
    last_sample = _last_t(folder / "samples" / "host.jsonl")
    assert last_sample is not None and last_sample >= killed_at - LOSS_S
