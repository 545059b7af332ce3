"""How ``run`` and the sweep wait for a training child: asleep in the kernel, not polling beside it."""

from __future__ import annotations

import os
import subprocess
import sys

from gpudoctor.launch import launcher as launch
from gpudoctor.processes.pids import ExitWaiter
from gpudoctor.sweep import trial


def _count_waitpid(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.waitpid

    def counted(pid: int, options: int) -> tuple[int, int]:
        calls.append(options)
        return real(pid, options)

    monkeypatch.setattr(os, "waitpid", counted)
    return calls


def test_the_doctor_waits_for_its_child_without_polling(monkeypatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(3)"])
    calls = _count_waitpid(monkeypatch)
    code = launch._wait(proc, launch._Interrupts())
    assert code == 3
    # Popen.wait(timeout) would call waitpid every <= 50 ms: ~30 times over 1.5 s
    assert len(calls) <= 3, f"waitpid called {len(calls)} times"


def test_a_sweep_waits_for_its_trial_without_polling(monkeypatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"], start_new_session=True)
    calls = _count_waitpid(monkeypatch)
    assert trial._wait(proc, 60.0, lambda: None) is False  # ended on its own, never pruned
    assert len(calls) <= 3, f"waitpid called {len(calls)} times"


def test_the_exit_waiter_times_out_then_gives_the_exit_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(5)"])
    waiter = ExitWaiter(proc)
    try:
        assert waiter.fd is not None, "Linux 5.3+ gives a pidfd"
        assert waiter.wait(0.01) is None
        assert waiter.wait(30) == 5
    finally:
        waiter.close()
    assert waiter.fd is None
