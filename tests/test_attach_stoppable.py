"""gdb stops only at moments that cannot break the patient (:mod:`gpudoctor.attach.stoppable`).

A stop while a rank waits on its c10d store makes the wait fail (``EINTR`` on a socket
with a timeout) and the rank die with ``DistNetworkError``: this killed a DDP patient in CI.
These tests hold a real process inside ``TCPStore.get`` and attach to it.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from gpudoctor.attach import stoppable
from tests.conftest import ROOT, gpudoctor_cmd

SCRIPT = Path(__file__).parent / "scripts" / "store_waiter.py"
linux = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def start_waiter(train_s: float) -> tuple[TCPStore, subprocess.Popen[str]]:
    """A store hosted here, and a 'rank' blocked in TCPStore.get on it, training ``train_s`` after "go"."""
    store = TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE="2", RANK="1")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(train_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "WAITING"
    return store, proc


@pytest.fixture
def waiter():
    store, proc = start_waiter(1.0)
    yield store, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_the_environment_tells_a_rank_and_its_store():
    assert stoppable.distributed({"PATH": "/usr/bin"}) is None
    assert stoppable.distributed({"WORLD_SIZE": "2", "MASTER_PORT": "29500"}) == stoppable.Distributed(29500)
    assert stoppable.distributed({"TORCHELASTIC_RUN_ID": "x"}) == stoppable.Distributed(None)


@linux
def test_a_rank_waiting_on_its_store_is_a_hazard_until_the_wait_ends(waiter):
    store, proc = waiter
    dist = stoppable.distributed({"WORLD_SIZE": "2", "MASTER_PORT": str(store.port)})
    deadline = time.time() + 10
    hazard = stoppable.why_not_now(proc.pid, dist)
    while hazard is None and time.time() < deadline:  # between "WAITING" and the blocking recv
        time.sleep(0.02)
        hazard = stoppable.why_not_now(proc.pid, dist)
    assert hazard is not None and hazard.max_wait_s is None  # waited for as long as it takes
    assert f"TCP connection to port {store.port}" in hazard.reason
    # Not a rank: a process blocked on some other TCP connection is only waited out for a while.
    other = stoppable.why_not_now(proc.pid, None)
    assert other is not None and other.max_wait_s == stoppable.SOFT_WAIT_S
    store.set("go", "1")
    deadline = time.time() + 10
    while stoppable.why_not_now(proc.pid, dist) is not None and time.time() < deadline:
        time.sleep(0.05)
    assert stoppable.why_not_now(proc.pid, dist) is None
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.split() == ["OK", "1"], err[-2000:]


@linux
def test_giving_up_returns_the_hazard_that_lasted(waiter):
    store, proc = waiter
    dist = stoppable.distributed({"WORLD_SIZE": "2", "MASTER_PORT": str(store.port)})
    give_up = threading.Event()
    threading.Timer(1.0, give_up.set).start()
    t0 = time.monotonic()
    hazard = stoppable.wait_until_stoppable(proc.pid, dist, give_up)
    assert hazard is not None and f"port {store.port}" in hazard.reason
    assert 0.9 <= time.monotonic() - t0 < 5
    assert proc.poll() is None  # looked at, never stopped


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gdb") is None or sys.platform != "linux", reason="attach injects with gdb")
@pytest.mark.gdb_inject
def test_attach_waits_out_a_store_wait_and_the_rank_lives(tmp_path: Path):
    store, proc = start_waiter(120.0)  # trains until the test sets "stop"
    doctor = subprocess.Popen(gpudoctor_cmd("attach", str(proc.pid), "--out", str(tmp_path / "run")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    time.sleep(4)  # the doctor is sampling, and holding the injection back
    assert proc.poll() is None
    installed = tmp_path / "run" / "attach" / f"{proc.pid}.installed.json"
    assert not installed.exists()
    go = time.time()
    store.set("go", "1")
    deadline = time.time() + 90  # gdb's stop comes once the wait is over; slow on a loaded machine
    while not installed.exists() and time.time() < deadline and doctor.poll() is None:
        time.sleep(0.1)
    assert installed.exists(), "the hooks were never installed"
    time.sleep(2)  # a few steps measured from inside
    doctor.send_signal(signal.SIGINT)  # detach while the rank still trains
    _, doctor_err = doctor.communicate(timeout=60)
    store.set("stop", "1")
    out, err = proc.communicate(timeout=60)
    # Before the fix: "DistNetworkError: Failed to recv, got 0 bytes" and exit 1.
    assert proc.returncode == 0 and out.split() == ["OK", "1"], err[-2000:]
    assert doctor.returncode == 0, doctor_err[-2000:]
    target = json.loads((tmp_path / "run" / "meta.json").read_text())["attach"]["targets"][0]
    assert target["requested_at"] < go - 1  # the doctor wanted in well before the wait ended ...
    assert target["requested_at"] + target["waited_s"] >= go  # ... and held the stop back until it had
    assert target["installed_at"] is not None
    assert target["detached"] is True
