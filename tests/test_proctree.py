"""ProcTree on real processes: descendants found as they appear, without reading every process each time."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from gpudoctor.processes import proctree
from gpudoctor.processes.proctree import ProcTree

# The parent prints, waits for a line, starts a child that starts a grandchild, prints their pids, waits.
PARENT = """
import subprocess, sys
print("up", flush=True)
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    " print(g.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
grand = child.stdout.readline().strip()
print(child.pid, grand, flush=True)
sys.stdin.readline()
"""


def test_new_descendants_are_found_by_reading_only_the_new_processes() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdin is not None
        assert parent.stdout.readline().strip() == "up"
        tree = ProcTree(parent.pid, full_rescan_s=3600)
        assert [p.pid for p in tree.refresh()] == [parent.pid]  # the first refresh reads everything
        after_full = tree.stats_read
        assert after_full > 1
        for _ in range(5):
            assert [p.pid for p in tree.refresh()] == [parent.pid]
        assert tree.stats_read == after_full, "nothing new on the machine: no process read again"

        parent.stdin.write("go\n")
        parent.stdin.flush()
        child, grand = map(int, parent.stdout.readline().split())
        found = {p.pid for p in tree.refresh()}
        assert found == {parent.pid, child, grand}, "a child and its own child, both new in one refresh"
        assert tree.stats_read - after_full < 20, "only the processes new since the last listing were read"
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


def test_exited_members_leave_and_a_gone_root_empties_the_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)']); "
                             "print(c.pid, flush=True); c.wait(); print('done', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        tree = ProcTree(proc.pid, full_rescan_s=3600)
        assert child in {p.pid for p in tree.refresh()}
        assert proc.stdout.readline().strip() == "done"  # reaped by its parent
        assert [p.pid for p in tree.refresh()] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert tree.refresh() == []


def test_a_live_member_missing_from_one_listing_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                             "print(c.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        tree = ProcTree(proc.pid, full_rescan_s=3600)
        assert {p.pid for p in tree.refresh()} == {proc.pid, child}
        listing = proctree._listing
        monkeypatch.setattr(proctree, "_listing", lambda: (listing() or set()) - {child})  # one listing misses it
        assert {p.pid for p in tree.refresh()} == {proc.pid, child}  # still running: still a member
        monkeypatch.setattr(proctree, "_listing", listing)
        assert {p.pid for p in tree.refresh()} == {proc.pid, child}
    finally:
        for kid in psutil.Process(proc.pid).children(recursive=True):
            kid.kill()
        proc.kill()
        proc.wait()
