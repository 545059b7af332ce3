"""SIGKILL at seeded moments: the doctor or the training dies, the recording survives.

What was on disk at the kill stays there, and ``gpudoctor report`` renders it, saying
when the recording is partial. Moments are counted in lines on disk, not seconds, so a
busy machine moves nothing. (How often the writers flush is a bench matter.)
"""

from __future__ import annotations

import contextlib
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

from tests.conftest import ROOT, cli, gpudoctor_cmd

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

TINY = str(ROOT / "tests" / "scripts" / "tiny_loop.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _doctor(folder: Path, seconds: float, stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(gpudoctor_cmd("run", "--out", str(folder), "--", sys.executable, TINY,
                                          "--seconds", str(seconds)),
                            stdout=stdout, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT)


# Seeded: the same moments on every run, spread over the recording, counted in host samples
# on disk (a clock would land elsewhere on a busy machine).
_RNG = random.Random(6)
KILL_AFTER_SAMPLES = sorted(_RNG.randint(2, 24) for _ in range(4))  # [4, 10, 17, 20]: a 120 s run, killed in its first half minute


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _wait_for_lines(path: Path, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _lines(path) < count:
        assert time.monotonic() < deadline, f"{path} never reached {count} lines"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Each moment's doctor SIGKILLed after that many host samples on disk, its training stopped after.

    The four runs go at once (their waits for samples overlap: the longest one's, not the sum), each killed at its own
    count, seen by polling every folder in turn.
    """
    root = tmp_path_factory.mktemp("sigkill")
    doctors = {n: _doctor(root / f"run{n}", seconds=120) for n in KILL_AFTER_SAMPLES}  # the kill is mid-run
    deadline = time.monotonic() + 240  # a starved idle sampler ticks every 2-3 s beside busy programs
    try:
        waiting = set(doctors)
        while waiting:
            for n in sorted(waiting):
                if _lines(root / f"run{n}" / "samples" / "host.jsonl") >= n:
                    doctors[n].send_signal(signal.SIGKILL)
                    doctors[n].wait(timeout=10)
                    waiting.discard(n)
            assert time.monotonic() < deadline, f"host samples never reached {sorted(waiting)}"
            time.sleep(0.02)
        alive = {n: _patient(root / f"run{n}").status() != psutil.STATUS_ZOMBIE for n in doctors}
        assert all(alive.values()), alive  # the training is not hurt: it runs on
    finally:
        for n, doctor in doctors.items():
            if doctor.poll() is None:
                doctor.kill()
                doctor.wait(timeout=10)
            with contextlib.suppress(OSError, ValueError, KeyError, psutil.Error):  # we stop it to save time
                patient = _patient(root / f"run{n}")
                patient.kill()
                psutil.wait_procs([patient], timeout=10)
    return {n: root / f"run{n}" for n in doctors}


def _patient(folder: Path) -> psutil.Process:
    return psutil.Process(json.loads((folder / "meta.json").read_text())["pid"])


@pytest.mark.parametrize("samples", KILL_AFTER_SAMPLES)
def test_sigkill_of_the_doctor_keeps_what_it_recorded(killed: dict[int, Path], samples: int) -> None:
    folder = killed[samples]
    host = folder / "samples" / "host.jsonl"
    proc = cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((folder / "report.json").read_text())
    assert json.loads((folder / "meta.json").read_text())["status"] == "running"
    assert report["run"]["status"] == "partial"
    assert any("partial" in n for n in report["notes"]), report["notes"]
    assert any(f["rule"] == "partial_recording" for f in report["findings"])
    assert _lines(host) >= samples  # what was on disk at the kill is all still there
    assert len(report["timeline"]["series"]["t_s"]) >= samples - 1  # and it is in the report
    assert "<html" in (folder / "report.html").read_text().lower()


def test_sigkill_of_the_training_process_gets_a_crashed_report(tmp_path):
    folder = tmp_path / "run"
    doctor = _doctor(folder, seconds=60, stdout=subprocess.PIPE)
    assert doctor.stdout is not None
    for _ in range(5):  # training has begun and gone a few steps
        assert doctor.stdout.readline().startswith("step")
    patient = psutil.Process(json.loads((folder / "meta.json").read_text())["pid"])
    events = folder / "events" / f"{patient.pid}.jsonl"
    _wait_for_lines(events, 3)  # the hooks have flushed once...
    deadline = time.monotonic() + 60
    while b'"k":"step"' not in events.read_bytes().replace(b" ", b""):  # ...and a step among what they flushed:
        assert time.monotonic() < deadline, "no step flushed"  # three lines alone may all precede the first step
        time.sleep(0.02)
    flushed = _lines(events)
    patient.kill()
    doctor.communicate(timeout=60)
    assert doctor.returncode == 128 + signal.SIGKILL  # the training's fate, as a shell reports it

    report = json.loads((folder / "report.json").read_text())  # written by the doctor
    assert report["run"]["status"] == "crashed" and report["run"]["exit_code"] == 137
    assert report["steps"]["count"] > 0 and report["breakdown"]["compute"] > 0
    assert _lines(events) >= flushed  # what the hooks had flushed survives the kill
    assert _lines(folder / "samples" / "host.jsonl") > 0
