"""Before any patient is stopped, the doctor asks gdb to call into a process of its own.

Where gdb's calls fail (a Firecracker guest with kernel 6.18 and gdb 13: "Couldn't write extended
state status"), stopping the patient gains nothing and risks its system calls: no patient is
stopped. gdb's answers are played by small stand-in scripts here; the real gdb of this machine is
asked too, and its answer must agree with the test suite's own probe (tests/gdb_probe.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpudoctor.attach import gdbcheck
from tests.gdb_probe import gdb_cannot_inject


def _fake_gdb(tmp_path: Path, prints: str) -> str:
    path = tmp_path / "gdb"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{prints}\nEOF\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("prints", "refused"), [
    ("Couldn't write extended state status: Bad address.", True),
    ("$1 = (void *) 0x7f6469290000", False),
    ("ptrace: Operation not permitted.", False),  # no verdict on calls: the patient's attach tells
    ("", False),
])
def test_a_failed_call_refuses_and_anything_else_lets_the_attach_decide(tmp_path: Path, prints: str,
                                                                        refused: bool) -> None:
    why = gdbcheck.cannot_call.__wrapped__(_fake_gdb(tmp_path, prints))
    assert (why is not None) == refused
    if refused:
        assert why == ("gdb cannot call into a process on this machine (Couldn't write extended state status: "
                       "Bad address; tried on a process of the doctor's own), so no process was stopped")


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_this_machines_gdb_gets_the_same_answer_as_the_suites_probe() -> None:
    gdb = shutil.which("gdb")
    assert gdb is not None
    assert (gdbcheck.cannot_call.__wrapped__(gdb) is None) == (gdb_cannot_inject() is None)
