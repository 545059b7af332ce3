"""``gpudoctor attach`` into a Python 3.14 process: the ``sys.remote_exec`` door, no debugger.

Needs a CPython 3.14 interpreter: ``$GPUDOCTOR_TEST_PYTHON314`` (``.ci/run`` sets it
with ``.ci/python314.sh``), else ``python3.14`` on PATH; skipped without one. There
is no torch for it here, so the patient is a pure-Python loop: what is checked is
the door itself, that the hooks go in by ``remote_exec``, come out on detach, and
leave the process running to a correct end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.attach.inject import PKG_PARENT
from tests.conftest import ROOT, cli_env, gpudoctor_cmd, run_cli


def python314() -> str | None:
    exe = os.environ.get("GPUDOCTOR_TEST_PYTHON314") or shutil.which("python3.14")
    if not exe:
        return None
    try:
        probe = subprocess.run([exe, "-c", "import sys; print(hasattr(sys, 'remote_exec'))"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # a stale path in the variable: skip, don't break collection
        return None
    return exe if probe.stdout.strip() == "True" else None


PY314 = python314()
pytestmark = pytest.mark.skipif(PY314 is None or sys.platform != "linux",
                                reason="needs a CPython 3.14 (GPUDOCTOR_TEST_PYTHON314 or python3.14 on PATH)")


@pytest.fixture(params=[0, 2], ids=["quiet", "two-cpu-hogs"])
def busy_machine(request: pytest.FixtureRequest) -> Iterator[int]:
    """The machine as found, or with two busy-looping programs beside the patient (issue #38)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(request.param)]
    try:
        yield request.param
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.slow
def test_python_314_patient_is_hooked_by_remote_exec_and_runs_on_after_detach(tmp_path: Path, busy_machine: int):
    assert PY314 is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDOCTOR_", "PYTHON"))}
    stop = tmp_path / "stop"  # the patient works until the doctor is done, however long load makes that
    patient = subprocess.Popen([PY314, str(ROOT / "tests" / "scripts" / "pure_loop.py"), "300", PKG_PARENT, str(stop)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(1.0)
        if busy_machine:
            doctor = _interrupted_once_hooked(patient.pid, tmp_path / "run")
        else:
            doctor = run_cli("attach", str(patient.pid), "--out", str(tmp_path / "run"), "--duration", "4", timeout=240)
        assert patient.poll() is None, "the patient must outlive the doctor"
    finally:
        stop.touch()
    # no torch, so no training to see: the doctor says so and exits 1, but the report is written
    assert doctor.returncode == 1 and "no training activity seen" in doctor.stderr, doctor.stderr[-2000:]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    target = meta["attach"]["targets"][0]
    assert target["method"] == "remote_exec" and target["gdb_s"] == 0.0
    assert target["installed_at"] is not None and target["error"] is None, meta["attach_notes"]
    assert target["detached"] is True, meta["attach"]
    assert target["tries"] >= 1 and target["try_budget_s"] >= 20.0  # what it did is on record
    # idle once hooked; its window over, back at normal priority for the detach and the report (root here)
    assert meta["doctor_priority"]["cpu"].endswith("once hooked (before: nice 10)")
    assert meta["doctor_priority"]["after_window"] == "normal: SCHED_OTHER, nice 0"
    out, err = patient.communicate(timeout=60)
    assert patient.returncode == 0 and "Traceback" not in err, err[-2000:]
    left = json.loads(out.strip().splitlines()[-1])
    assert left["ok"] is True and left["done"] > 0
    assert left["finders"] == 0, "the import hook must be gone after the detach"
    assert left["path_left"] is False, "the payload's sys.path entry must be gone after the detach"
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["run"]["mode"] == "attach"
    assert report["run"]["status"] == ("interrupted" if busy_machine else "detached")
    # a loop with no DataLoader, optimizer or GPU: nothing to charge, so only info findings
    assert report["findings"] and {f["severity"] for f in report["findings"]} == {"info"}


def _interrupted_once_hooked(pid: int, out: Path) -> subprocess.CompletedProcess[str]:
    """Beside busy programs: attach with no window, wait (however long load makes it) until the hooks are
    in, then Ctrl-C. An idle doctor on saturated cores must still end on time: the waker puts it back at
    normal priority on the signal (before it, an idle doctor's window ran on for minutes)."""
    doctor = subprocess.Popen(gpudoctor_cmd("attach", str(pid), "--out", str(out)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and doctor.poll() is None:
            with contextlib.suppress(OSError, ValueError, KeyError):  # not written yet, or mid-write
                if "once hooked" in json.loads((out / "meta.json").read_text())["doctor_priority"]["cpu"]:
                    break
            time.sleep(0.5)
        assert doctor.poll() is None, "the doctor ended before its hooks were in"
        doctor.send_signal(signal.SIGINT)
        stdout, stderr = doctor.communicate(timeout=120)  # minutes before the waker; seconds with it
    finally:
        if doctor.poll() is None:
            doctor.kill()
            doctor.wait()
    return subprocess.CompletedProcess(doctor.args, doctor.returncode, stdout, stderr)
