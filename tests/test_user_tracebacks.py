"""The doctor's wrappers stay out of the user's tracebacks (issue #38 item 5).

A real small loop raises from its own code through a call the doctor wraps (``loss.backward()``, a
DataLoader's ``next()``, in the main process and in a worker). Under ``gpudoctor run`` the
traceback on stderr must be the one the bare run prints: the same frames, the same exception and
message, and no frame of gpudoctor.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "raising_loop.py")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in \S+$')
_RAISED = re.compile(r"^\w*(Error|Exception)\b.*$")


def traceback_of(stderr: str) -> list[str]:
    """The frames (``File ..., line N, in name``) and exception lines of every traceback printed."""
    return [ln.strip() for ln in stderr.splitlines() if _FRAME.match(ln) or _RAISED.match(ln)]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["backward", "getitem", "getitem-workers"])
def test_a_user_error_raised_through_a_wrapped_call_reads_as_it_does_bare(tmp_path: Path, where: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bare = subprocess.run([sys.executable, SCRIPT, where], capture_output=True, text=True, timeout=300, env=env)
    doctor = run_cli("run", "--out", str(tmp_path / "run"), "--", sys.executable, SCRIPT, where)
    assert bare.returncode == 1 and "PlantedError: planted in the user's" in bare.stderr, bare.stderr[-2000:]
    seen = traceback_of(doctor.stderr)
    assert not [ln for ln in seen if "gpudoctor" in ln], doctor.stderr[-3000:]
    assert seen == traceback_of(bare.stderr), doctor.stderr[-3000:]
