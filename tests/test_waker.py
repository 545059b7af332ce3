"""The waker puts an idle doctor back at normal priority on its deadline, its patient's end and Ctrl-C.

Each case is a child interpreter that lowers itself as a doctor does (``lower_doctor``), then reports the
scheduling policy and nice value of its main thread when the waker should have acted. Raising a thread
from nice 19 back to 0 needs CAP_SYS_NICE: skipped without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="SCHED_IDLE and raising priority back: Linux, as root")

_DOCTOR = textwrap.dedent("""
    import json, os, signal, subprocess, sys, threading, time
    from gpudoctor.processes import priority, waker
    case = sys.argv[1]
    signal.signal(signal.SIGINT, lambda *a: None)  # the doctor's own handler: the C level writes the wakeup fd
    patient = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    priority.start_normal_spawner()
    w = waker.start(time.time() + 0.5 if case == "deadline" else None, (patient.pid,) if case == "exit" else ())
    priority.lower_doctor()
    lowered = priority.thread_priority(os.getpid(), threading.get_native_id())
    print(json.dumps({"lowered": lowered}), flush=True)
    end = time.time() + 30  # the deadline, the patient's end, or the test's SIGINT comes well within it
    while time.time() < end and priority.thread_priority(os.getpid(), threading.get_native_id()) == lowered:
        time.sleep(0.05)
    print(json.dumps({"after": priority.thread_priority(os.getpid(), threading.get_native_id()),
                      "waker_exit": w.proc.wait(10) if w and w.proc else "none"}), flush=True)
    patient.wait()
""")


def _doctor(case: str) -> tuple[list[object], list[object], object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _DOCTOR, case], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    lowered = json.loads(proc.stdout.readline())["lowered"]
    if case == "signal":
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    after = json.loads(out.strip().splitlines()[-1])
    return lowered, after["after"], after["waker_exit"]


@pytest.mark.parametrize("case", ["deadline", "exit", "signal"])
def test_the_waker_puts_an_idle_doctor_back_at_normal_priority(case: str) -> None:
    lowered, after, waker_exit = _doctor(case)
    assert lowered == ["SCHED_IDLE", 19]
    assert after == ["SCHED_OTHER", 0], f"{case}: the doctor was left at {after}"
    assert waker_exit == 0, "the waker ends once it has acted"


def test_the_waker_waits_while_nothing_happens_and_ends_with_its_stop() -> None:
    code = textwrap.dedent("""
        import json, os, threading, time
        from gpudoctor.processes import priority, waker
        priority.start_normal_spawner()
        w = waker.start(time.time() + 60, ())
        priority.lower_doctor()
        time.sleep(1.0)
        mine = priority.thread_priority(os.getpid(), threading.get_native_id())
        running = w.proc.poll() is None
        w.stop()
        print(json.dumps({"mine": mine, "running": running, "stopped": w.proc is None}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                    timeout=60).stdout.strip().splitlines()[-1])
    assert got == {"mine": ["SCHED_IDLE", 19], "running": True, "stopped": True}
