"""HostSampler on a real process tree: a parent with two busy children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from itertools import pairwise

import psutil
import pytest

from gpudoctor.recording import JsonlAppender
from gpudoctor.recording.store import read_jsonl
from gpudoctor.samplers import HostSampler

# The parent starts two children that burn CPU for ~1 s and print the CPU seconds
# they used, then it lingers 0.4 s alone so the sampler sees them gone.
TREE = r"""
import subprocess, sys, time
busy = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass\nprint(time.process_time())"
kids = [subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
        for _ in range(2)]
print(sum(float(k.communicate()[0]) for k in kids), flush=True)
time.sleep(0.4)
"""

ROW_KEYS = {
    "t", "m", "cpu_proc_pct", "cpu_main_pct", "procs", "n_procs", "rss_mib", "read_mib_s",
    "write_mib_s", "n_cpus", "cpu_percore_pct", "cpu_total_pct", "iowait_pct",
    "disk_read_mib_s", "disk_write_mib_s", "mem_available_mib",
}  # fmt: skip


def test_sees_the_tree_its_cpu_and_memory_and_survives_children_exiting(tmp_path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    sampler = HostSampler(
        parent.pid, JsonlAppender(tmp_path / "host.jsonl"), interval_s=0.05, tree_refresh_s=0.1
    )
    sampler.start()
    seen_pids: set[int] = set()
    while parent.poll() is None:
        seen_pids |= sampler.pids()
        time.sleep(0.05)
    children_cpu_s = float(parent.stdout.read().split()[0])
    sampler.stop()
    sampler.stop()  # idempotent

    rows, bad = read_jsonl(tmp_path / "host.jsonl")
    lines = (tmp_path / "host.jsonl").read_text().splitlines()
    assert bad == 0 and len(lines) == len(rows) >= 15
    assert all(json.loads(line).keys() - {"others"} == ROW_KEYS for line in lines)  # others: every 3 s
    assert sampler.errors == []
    assert len(seen_pids) >= 3 and parent.pid in seen_pids

    counts = [r["n_procs"] for r in rows]
    first_full = counts.index(3)
    assert 1 in counts[first_full:], "rows go on after the children exit"
    full = rows[first_full]
    assert str(parent.pid) in full["procs"] and len(full["procs"]) == 3
    assert max(r["cpu_proc_pct"] for r in rows) > 50.0
    assert all(r["rss_mib"] > 0 for r in rows if r["n_procs"])
    assert all(len(r["cpu_percore_pct"]) == r["n_cpus"] for r in rows)

    # CPU seconds integrated from the rows match what the children say they used
    # (a child found a tick late is counted from its creation).
    cpu_s = sum(b["cpu_proc_pct"] / 100 * (b["t"] - a["t"]) for a, b in pairwise(rows))
    assert 0.6 * children_cpu_s < cpu_s < 1.3 * children_cpu_s + 0.2


def test_a_dead_root_gives_host_rows_without_errors() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sampler = HostSampler(gone.pid, None)
    time.sleep(0.02)
    row = sampler.sample()
    assert row["n_procs"] == 0 and row["cpu_proc_pct"] == 0.0 and row["cpu_main_pct"] is None
    assert row["mem_available_mib"] > 0 and sampler.pids() == set()
    assert sampler.errors == []



def test_another_gpudoctor_is_named_apart_by_pid(tmp_path) -> None:
    """Another user's doctor beside the run read as "gpudoctor (0.5 core)", as if it were this one's
    cost (issue #38): a busy program whose command name is ``gpudoctor`` is "another gpudoctor (pid N)"."""
    script = tmp_path / "gpudoctor"
    script.write_text(f"#!{sys.executable}\nimport time\nt = time.time()\nwhile time.time() - t < 20: pass\n")
    script.chmod(0o755)
    other = subprocess.Popen([str(script)])
    patient = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    try:
        sampler = HostSampler(patient.pid, None, interval_s=0.05)
        seen: list[dict] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(o["name"].startswith("another") for o in seen):
            time.sleep(0.5)
            seen = sampler._other_programs(time.monotonic()) or []
        names = [o["name"] for o in seen]
        assert f"another gpudoctor (pid {other.pid})" in names and "gpudoctor" not in names
    finally:
        for proc in (other, patient):
            proc.kill()
            proc.wait()


LATE_CHILD = r"""
import subprocess, sys, time
time.sleep(0.5)  # born after the sampler's first listing
busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\nprint('burned', flush=True)\ntime.sleep(30)"
spawned = time.time()  # the child's birth, a fork later: its life from here, on time.time()'s clock
kid = subprocess.Popen([sys.executable, "-c", busy])
print(kid.pid, spawned, flush=True)
time.sleep(30)
"""


def test_a_child_found_late_is_rated_over_its_life_not_the_last_tick() -> None:
    """The tree is re-listed every few ticks: a child found a second after its birth has a second
    of CPU, which over the last 10 ms tick read as 100 single-threaded cores (a report of a
    busy torchrun job failed its own check with cpu_pct over 10000)."""
    parent = subprocess.Popen([sys.executable, "-c", LATE_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        sampler = HostSampler(parent.pid, None, tree_refresh_s=3600.0)  # lists the parent alone
        pid, spawned = parent.stdout.readline().split()
        child = int(pid)
        assert parent.stdout.readline().strip() == "burned"  # its second of CPU (longer on a busy machine), then sleeps
        sampler.sample()  # a tick that does not re-list the tree
        sampler.tree_refresh_s = 0.0
        time.sleep(0.01)
        row = sampler.sample()  # re-lists: the child is new, its CPU since birth all in one short tick
        kid = psutil.Process(child)
        # over its life from the parent's clock: psutil's create_time may read a second early (common.proctime)
        life_pct = 100.0 * sum(kid.cpu_times()[:2]) / (time.time() - float(spawned))
        assert row is not None and str(child) in row["procs"]
        # one thread: at most one core; rated over its life (a second of CPU over however long it took)
        assert row["procs"][str(child)] <= 105.0
        assert row["procs"][str(child)] == pytest.approx(life_pct, rel=0.3)
        assert row["cpu_proc_pct"] <= 100.0 * (os.cpu_count() or 1)
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


class _SlowRead(HostSampler):
    """A host sampler whose read is descheduled for 0.3 s halfway, as at idle priority on a busy host."""

    def sample(self):  # type: ignore[no-untyped-def]
        time.sleep(0.15)
        row = super().sample()
        time.sleep(0.15)
        return row


def test_a_row_is_stamped_at_the_middle_of_its_read_not_before_it(tmp_path) -> None:
    sampler = _SlowRead(os.getpid(), JsonlAppender(tmp_path / "host.jsonl"), interval_s=10.0)
    t0, m0 = time.time(), time.monotonic()
    sampler.tick()
    t1, m1 = time.time(), time.monotonic()
    sampler.writer.close()  # type: ignore[union-attr]
    (row,), bad = read_jsonl(tmp_path / "host.jsonl")
    assert bad == 0
    assert t1 - t0 >= 0.3
    # stamped at its start the row read t0 (0.15 s before the tree was read); at the middle, within
    # a few ms of (t0 + t1) / 2 on both clocks
    assert abs(row["t"] - (t0 + t1) / 2) < 0.05, (row["t"] - t0, t1 - t0)
    assert abs(row["m"] - (m0 + m1) / 2) < 0.05, (row["m"] - m0, m1 - m0)
