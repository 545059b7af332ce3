"""How ``run`` waits for its training child: asleep in the kernel, not polling beside the training."""

from __future__ import annotations

import os
import subprocess
import sys

from gpudoctor import launch


def test_the_doctor_waits_for_its_child_without_polling(monkeypatch) -> None:
    calls = []
    real = os.waitpid

    def counted(pid: int, options: int) -> tuple[int, int]:
        calls.append(options)
        return real(pid, options)

    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(3)"])
    monkeypatch.setattr(os, "waitpid", counted)
    code = launch._wait(proc, launch._Interrupts())
    assert code == 3
    # Popen.wait(timeout) would call waitpid every <= 50 ms: ~30 times over 1.5 s
    assert len(calls) <= 3, f"waitpid called {len(calls)} times"


def test_the_exit_waiter_times_out_then_gives_the_exit_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(5)"])
    waiter = launch._ExitWaiter(proc)
    try:
        assert waiter.fd is not None, "Linux 5.3+ gives a pidfd"
        assert waiter.wait(0.01) is None
        assert waiter.wait(30) == 5
    finally:
        waiter.close()
    assert waiter.fd is None
