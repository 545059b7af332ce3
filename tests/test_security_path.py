"""Nothing of another user's runs as root through PATH (issue 34, row 3).

Root's PATH may hold an empty entry (``PATH=:/usr/bin``, a trailing ``:``), which means the
current folder. Run as root from a folder another user owns, every program the doctor or a
stdlib helper starts by name (``platform.platform()`` runs ``uname -p``, gdb runs ``iconv -l``)
would then be hers. Each test puts her fake programs there and checks none of them ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.attach import inject
from gpudoctor.processes import childpy
from tests.conftest import ROOT, run_cli

FAKES = ("uname", "iconv", "ldconfig", "gcc", "cc", "ld", "objdump", "lsb_release", "nvidia-smi", "which")


def _her_programs(folder: Path, uid: int, gid: int) -> Path:
    """Her fake programs in ``folder``: each appends its name to ``ran`` there, then exits 0."""
    ran = folder / "ran"
    for name in FAKES:
        fake = folder / name
        fake.write_text(f"#!/bin/sh\necho {name} >> {ran}\n")
        fake.chmod(0o755)
        os.chown(fake, uid, gid)
    return ran


def _ran(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


@pytest.fixture
def her_cwd(other_user, other_user_dir, monkeypatch):
    """The current folder is hers, full of her programs, and PATH starts with an empty entry."""
    marker = _her_programs(other_user_dir, other_user.uid, other_user.gid)
    monkeypatch.chdir(other_user_dir)
    monkeypatch.setenv("PATH", ":" + os.environ.get("PATH", os.defpath))
    return marker


def test_host_info_runs_no_program_of_the_current_folder(her_cwd):
    # a fresh interpreter: platform caches what uname -p said
    code = "from gpudoctor.launch.recorder import host_info; print(host_info()['platform'])"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(os.uname().sysname + "-" + os.uname().release)
    assert _ran(her_cwd) == ""


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_gdb_runs_no_program_of_the_current_folder(her_cwd):
    # gdb runs `iconv -l` by name as it starts; the doctor's gdb gets the system PATH only
    gdb = childpy.which("gdb")
    assert gdb is not None
    out = inject._run_gdb([gdb, "-nx", "-batch", "-ex", "show host-charset"], 60)
    assert "character set" in out
    assert _ran(her_cwd) == ""


def test_the_doctors_children_get_the_system_path_only(her_cwd):
    env = childpy.doctor_env()
    assert env["PATH"] == childpy.SYSTEM_PATH
    assert all(os.path.isabs(p) for p in env["PATH"].split(os.pathsep))
    assert env.get("HOME") == os.environ.get("HOME")  # only PATH changes


def test_a_root_run_started_in_her_folder_runs_none_of_her_programs(her_cwd, tmp_path):
    # the whole doctor of `run` (host info, priority, samplers, the report) beside an absolute command
    out = tmp_path / "out"
    proc = run_cli("run", "--out", str(out), "--", sys.executable, "-c", "pass",
                   cwd=Path.cwd(), env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.json").exists()
    assert _ran(her_cwd) == ""


def test_the_users_own_command_keeps_the_users_path(tmp_path, monkeypatch):
    # never alter the training's run: its PATH is the user's, empty entry included
    path = ":" + os.environ.get("PATH", os.defpath)
    probe = "import os, sys; open(sys.argv[1], 'w').write(os.environ['PATH'])"
    seen = tmp_path / "path.txt"
    proc = run_cli("run", "--out", str(tmp_path / "out"), "--", sys.executable, "-c", probe, str(seen),
                   env={"PATH": path})
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == path
