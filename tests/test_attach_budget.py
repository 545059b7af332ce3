"""attach on a busy machine (issue #38): each injection's time limit grows with the load it sees,
a try that ran out of time is tried again, and the report says how many tries and how long."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpudoctor.attach import budget, inject
from gpudoctor.report.attach import attach_section

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_budget_is_never_shorter_than_on_a_quiet_machine_and_says_what_it_read(spinner):
    seen = budget.measure(spinner.pid, sample_s=0.2)
    assert 1.0 <= seen.factor <= budget.MAX_FACTOR
    assert seen.load_per_core is not None and seen.run_delay_share is not None  # a spinning thread wants a core
    assert seen.seconds(budget.INJECT_BASE_S) >= budget.INJECT_BASE_S


def test_a_gone_process_gets_a_budget_from_the_load_alone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    seen = budget.measure(gone.pid, sample_s=0.01)
    assert seen.run_delay_share is None and seen.factor >= 1.0


def test_a_door_that_ran_out_of_time_before_queueing_may_be_tried_again():
    with pytest.raises(inject.InjectTimeout, match="timed out after"):
        inject._run_gdb(["sleep", "30"], 0.5)


def test_a_door_that_queued_the_call_before_its_time_ran_out_counts_as_in():
    out = inject._run_gdb(["sh", "-c", "echo 'GPUDOCTOR pending 0'; exec sleep 30"], 1.0)
    assert "GPUDOCTOR pending 0" in out


def _meta(**target: object) -> dict[str, object]:
    base = {"pid": 7, "rank": None, "create_time": 90.0, "installed_at": 131.0, "method": "remote_exec",
            "underway": True, "error": None}
    return {"mode": "attach", "attach_time": 100.0, "attach": {"targets": [{**base, **target}]}}


def test_the_report_says_how_many_tries_and_how_long_on_a_busy_machine():
    section = attach_section(_meta(tries=2, try_budget_s=78.0, budget_factor=3.9, load_per_core=3.9,
                                   run_delay_share=0.61, queued_s=30.5), 131.0)
    assert section is not None
    line = section["loaded"][0]
    assert "31.0 s after the attach (2 tries, queued in 30.5 s: load 3.9 per core" in line, line
    assert "its main thread waited 61% of the time for a core; up to 78 s a try)" in line, line


def test_a_quiet_machine_s_first_try_is_not_worded():
    section = attach_section(_meta(tries=1, try_budget_s=20.0, budget_factor=1.0, load_per_core=0.2,
                                   run_delay_share=0.0, queued_s=0.4), 131.0)
    assert section is not None and "try" not in section["loaded"][0]
