"""A process's start on ``time.time()``'s clock, against a child started between two readings of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from gpudoctor.common.proctime import started_at

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_child_started_between_two_clock_readings_is_dated_between_them() -> None:
    """Within a clock tick (10 ms, read as 20) of the Popen: psutil's create_time may sit a second
    before it on a host whose boot time has a large fraction (0.95 s on the machine this was found on),
    which made the host sampler take a child born after the watch began for one born before it."""
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    after = time.time()
    try:
        born = started_at(child.pid)
        assert born is not None
        assert before - 0.02 <= born <= after + 0.02
        skew = born - psutil.Process(child.pid).create_time()
        assert 0.0 <= skew < 1.02  # psutil's is the same start, whole-second boot time and all
    finally:
        child.kill()
        child.wait()


def test_our_own_start_is_before_now_and_a_missing_pid_has_none() -> None:
    mine = started_at(os.getpid())
    assert mine is not None and mine <= time.time()
    assert started_at(2**22 + 12345) is None  # above pid_max: no such /proc entry
