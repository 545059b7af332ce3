"""Timings in several forked processes, their median kept (issue #40): one process is one draw.

Real forks of this test process: each draw runs in a child of its own, answers on a pipe, and
dies with the process that forked it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.launch import draws
from gpudoctor.processes.pids import pid_alive

ROOT = Path(__file__).parent.parent


def test_each_draw_is_a_process_of_its_own_and_gets_its_budget() -> None:
    got, error = draws.in_forks(lambda seconds: [os.getpid(), os.getppid(), seconds], 2.5, 60.0)
    assert error is None and len(got) == draws.DRAWS
    assert len({pid for pid, _, _ in got}) == draws.DRAWS and all(pid != os.getpid() for pid, _, _ in got)
    assert all(parent == os.getpid() and seconds == 2.5 for _, parent, seconds in got)


def test_no_draw_starts_that_the_total_cannot_hold() -> None:
    got, _ = draws.in_forks(lambda seconds: time.sleep(0.6) or "slow", 1.0, 1.0)  # 0.6 + 0.6 > 1
    assert got == ["slow"]


def test_a_draw_that_raises_stops_the_rest_and_says_why() -> None:
    got, error = draws.in_forks(lambda seconds: 1 / 0, 1.0, 60.0)
    assert got == [] and error is not None and error.startswith("ZeroDivisionError")


def test_a_draw_that_dies_without_answering_is_an_error_not_a_figure() -> None:
    got, error = draws.in_forks(lambda seconds: os._exit(3), 1.0, 60.0)
    assert got == [] and error is not None and "without its figures" in error


def test_a_draw_dies_with_the_worker_that_forked_it(tmp_path: Path) -> None:
    """The doctor stops a worker that overruns with SIGKILL: its draw must not outlive it."""
    pid_file = tmp_path / "draw.pid"
    code = textwrap.dedent(f"""
        import os, time
        from gpudoctor.launch import draws
        def run(seconds):
            with open({str(pid_file)!r}, "w") as fh:
                fh.write(str(os.getpid()))
            time.sleep(120)
        draws.in_forks(run, 1.0, 60.0)
    """)
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and worker.poll() is None, "the draw never started"
        time.sleep(0.05)
    draw = int(pid_file.read_text())
    assert pid_alive(draw)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    while pid_alive(draw):
        assert time.monotonic() < deadline, "the draw outlived its worker"
        time.sleep(0.05)


def test_the_median_keeps_the_shape_of_the_draws_and_outvotes_a_bent_width() -> None:
    steady = {1024.0: 1.0, 344.0: 0.15, 128.0: 0.04}
    slow = {w: 1.2 * s for w, s in steady.items()}  # a process that ran everything 20% slow
    bent = {1024.0: 0.86, 344.0: 0.15, 128.0: 0.04}  # one that timed the widest width fast
    merged = draws.median_ratios([steady, slow, bent])
    assert list(merged) == [1024.0, 344.0, 128.0]  # in the order timed
    assert merged[1024.0] == pytest.approx(1.0)  # the median scale
    assert merged[344.0] / merged[1024.0] == pytest.approx(0.15)  # the median shape, not the bent draw's
    assert merged[128.0] / merged[1024.0] == pytest.approx(0.04)


def test_a_width_only_some_draws_reached_is_read_from_those() -> None:
    merged = draws.median_ratios([{512.0: 1.0, 256.0: 0.3, 64.0: 0.05}, {512.0: 2.0, 256.0: 0.6}])
    assert merged[512.0] == pytest.approx(1.5) and merged[256.0] == pytest.approx(0.45)
    assert merged[64.0] == pytest.approx(0.075)  # the one draw's ratio, at the median scale
