"""``gpudoctor attach`` run as root beside another user's training (issue 12, issue 11 item 3).

What a root doctor must never do for that user: run their interpreter or files with
root's privileges, run gdb commands from a folder they can write, follow their links
or wait on their FIFOs, or let them refuse the attach with a lock in /tmp. And a
``__main__`` that shadows every builtin name must not keep the hooks out; if the
bootstrap fails, the report says why. Real processes, real files: the patient and the
attacker run as ``other_user``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ROOT, OtherUser, gpudoctor_cmd, run_cli
from tests.test_attach_remote_exec import PY314

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None or sys.platform != "linux",
                                reason="attach injects with gdb on Linux")

PATIENT = ROOT / "tests" / "scripts" / "odd_main.py"


@pytest.fixture
def shared_out() -> Iterator[Path]:
    """``--out`` in a root folder the patient's user can traverse (pytest's tmp_path is root-only)."""
    parent = Path(tempfile.mkdtemp(prefix="gpudoctor-sec-", dir="/tmp"))
    parent.chmod(0o755)
    yield parent / "run"
    shutil.rmtree(parent, ignore_errors=True)


def start_patient(python: str, mode: str, seconds: float, user: OtherUser | None = None,
                  until_eof: bool = False) -> subprocess.Popen[str]:
    """``until_eof``: the patient also ends when ``communicate`` closes its stdin (``seconds`` a cap)."""
    kwargs: dict[str, Any] = user.popen_kwargs() if user else {}
    argv = [python, str(PATIENT), mode, str(seconds), *(["until-eof"] if until_eof else [])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if until_eof else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PATH": os.defpath}, cwd="/", **kwargs)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def start_attacker(user: OtherUser, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([user.python, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={"PATH": os.defpath}, cwd="/", **user.popen_kwargs())


def stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "meta.json").read_text())


def target(out: Path) -> dict[str, Any]:
    return meta(out)["attach"]["targets"][0]


# -- finding 2: gdb's commands never come from a folder the patient's user can write --------------
SWAPPER = r"""
import os, sys, time
control, marker = sys.argv[1], sys.argv[2]
evil = "shell touch %s\nquit\n" % marker
deadline = time.time() + 120
while time.time() < deadline:
    try:
        names = os.listdir(control)
    except OSError:
        continue
    for name in names:
        if name.startswith("gdb-") and not name.endswith(".swap"):
            tmp = os.path.join(control, name + ".swap")
            try:
                with open(tmp, "w") as fh:
                    fh.write(evil)
                os.replace(tmp, os.path.join(control, name))
            except OSError:
                pass
"""

GDB_SHIM = """#!/bin/sh
prev=
for a in "$@"; do
  if [ "$prev" = "-x" ]; then
    echo "$a" >> "{log}/scripts"
    stat -c '%u %a' "$(dirname "$a")" >> "{log}/dirs"
  fi
  prev=$a
done
exec {gdb} "$@"
"""


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_gdb_commands_come_from_the_doctors_private_folder_not_the_patients(
        other_user: OtherUser, shared_out: Path, tmp_path: Path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "gdb").write_text(GDB_SHIM.format(log=tmp_path, gdb=shutil.which("gdb")))
    (shim / "gdb").chmod(0o755)
    marker = Path(tempfile.gettempdir()) / f"gpudoctor-pwned-{os.getpid()}"
    marker.unlink(missing_ok=True)
    patient = start_patient(other_user.python, "loop", 30, other_user)
    attacker = start_attacker(other_user, SWAPPER, str(shared_out / "attach"), str(marker))
    try:
        doctor = run_cli("attach", str(patient.pid), "--out", str(shared_out), "--duration", "3", timeout=180,
                         env={"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"})
    finally:
        stop(attacker, patient)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    assert not marker.exists(), "root's gdb ran commands the patient's user swapped in"
    scripts = (tmp_path / "scripts").read_text().split()
    assert scripts, "the doctor did not run gdb"
    for script in scripts:
        assert not Path(script).resolve().is_relative_to(shared_out.resolve()), script
    assert set((tmp_path / "dirs").read_text().split("\n")) - {""} == {"0 700"}
    assert target(shared_out)["installed_at"] is not None, target(shared_out)


# -- finding 3: links and FIFOs planted in attach/ ---------------------------------------------
PLANT = r"""
import os, sys, time
kind, path, dest = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.time() + 120
while time.time() < deadline:
    try:
        os.mkfifo(path) if kind == "fifo" else os.symlink(dest, path)
        print("planted", flush=True)
        break
    except OSError:
        time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_the_detach_flag_is_never_written_through_a_planted_link(
        other_user: OtherUser, shared_out: Path, tmp_path: Path):
    victim = tmp_path / "root-only.txt"
    victim.write_text("precious")
    patient = start_patient(other_user.python, "loop", 30, other_user)
    attacker = start_attacker(other_user, PLANT, "link", str(shared_out / "attach" / "detach"), str(victim))
    try:
        doctor = run_cli("attach", str(patient.pid), "--out", str(shared_out), "--duration", "3", timeout=180)
        assert attacker.communicate(timeout=60)[0].strip() == "planted"
    finally:
        stop(attacker, patient)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    assert victim.read_text() == "precious"
    assert not (shared_out / "attach" / "detach").is_symlink()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "link"])
@pytest.mark.gdb_inject
def test_a_status_file_planted_as_a_fifo_or_link_is_refused_not_waited_on_or_followed(
        other_user: OtherUser, shared_out: Path, tmp_path: Path, kind: str):
    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps({"ok": False, "t": 1.0, "error": "ROOT-ONLY-SECRET"}))
    patient = start_patient(other_user.python, "block", 60, other_user)  # its hooks never go in
    status = shared_out / "attach" / f"{patient.pid}.installed.json"
    attacker = start_attacker(other_user, PLANT, kind, str(status), str(secret))
    try:
        doctor = run_cli("attach", str(patient.pid), "--out", str(shared_out), "--duration", "3", timeout=120)
    finally:
        stop(attacker, patient)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    text = (shared_out / "meta.json").read_text()
    assert "ROOT-ONLY-SECRET" not in text
    assert "refused the status file" in (target(shared_out)["error"] or ""), target(shared_out)


# -- smaller: locks in a folder only the doctor's user can write; a SIGKILLed doctor ----------------
@pytest.mark.slow
def test_a_lock_planted_in_tmp_by_another_user_does_not_refuse_roots_attach(
        other_user: OtherUser, shared_out: Path):
    from gpudoctor.attach.lock import lock_path

    patient = start_patient(other_user.python, "loop", 30, other_user)
    planted = Path(tempfile.gettempdir()) / f"gpudoctor-attach-{patient.pid}.lock"
    squatter = start_attacker(other_user, "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid()));"
                              " print('planted', flush=True); time.sleep(120)", str(planted))
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "planted"
        doctor = run_cli("attach", str(patient.pid), "--out", str(shared_out), "--duration", "1", "--no-inject",
                         timeout=120)
    finally:
        stop(squatter, patient)
        planted.unlink(missing_ok=True)
    assert "already attached" not in doctor.stderr and doctor.returncode in (0, 1), doctor.stderr[-2000:]
    folder = lock_path(patient.pid).parent
    st = folder.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


def _pyspy_children(doctor: psutil.Process) -> list[psutil.Process]:
    try:
        return [c for c in doctor.children() if c.name() == "py-spy"]
    except psutil.Error:
        return []


@pytest.mark.slow
def test_a_sigkilled_doctor_leaves_no_py_spy_and_the_next_attach_cleans_its_lock_and_scratch(
        shared_out: Path, tmp_path: Path):
    from gpudoctor.attach import scratch
    from gpudoctor.attach.lock import lock_path

    patient = start_patient(sys.executable, "loop", 60)
    env = {k: v for k, v in os.environ.items() if k != "GPUDOCTOR_RUN_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    doctor = subprocess.Popen(gpudoctor_cmd("attach", str(patient.pid), "--out", str(shared_out), "--no-inject"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    stopped: list[psutil.Process] = []
    try:
        deadline = time.time() + 120
        while not stopped and time.time() < deadline and doctor.poll() is None:
            for spy in _pyspy_children(psutil.Process(doctor.pid)):
                spy.suspend()  # a stopped py-spy cannot end its window by itself: only a kill ends it
                stopped.append(spy)
            time.sleep(0.05)
        assert stopped, "the doctor started no py-spy"
        token = scratch.process_token(doctor.pid)
        doctor.send_signal(signal.SIGKILL)
        doctor.wait(timeout=30)
        deadline = time.time() + 60
        while any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in stopped) and time.time() < deadline:
            time.sleep(0.1)
        left = [s.pid for s in stopped if s.is_running() and s.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"py-spy {left} outlived its doctor"
        assert lock_path(patient.pid).exists() and token is not None
        assert (scratch.state_dir() / f"session-{token}").is_dir()
        again = run_cli("attach", str(patient.pid), "--out", str(tmp_path / "again"), "--duration", "1",
                        "--no-inject", timeout=120)
        assert again.returncode in (0, 1), again.stderr[-2000:]
        assert not (scratch.state_dir() / f"session-{token}").exists()
        assert not lock_path(patient.pid).exists()
    finally:
        for spy in stopped:
            with contextlib.suppress(psutil.Error):
                spy.kill()
        stop(patient)
        if doctor.poll() is None:
            doctor.kill()


# -- finding 1: root never runs the patient's Python with root's privileges -------------------
@pytest.mark.slow
@pytest.mark.skipif(PY314 is None, reason="needs a CPython 3.14 (GPUDOCTOR_TEST_PYTHON314 or python3.14 on PATH)")
def test_remote_exec_never_runs_the_patient_users_interpreter_or_pth_files_as_root(
        other_user: OtherUser, other_user_dir: Path, shared_out: Path):
    assert PY314 is not None
    real = Path(PY314).resolve()
    usr = other_user_dir / "py" / "usr"
    (usr / "bin").mkdir(parents=True)
    (usr / "lib").mkdir()
    exe = usr / "bin" / real.name
    shutil.copy2(real, exe)  # the patient's user's own copy: a uv / pyenv / conda / venv --copies Python
    (usr / "lib" / f"python{real.name.removeprefix('python')}").symlink_to(real.parent.parent / "lib" /
                                                                          f"python{real.name.removeprefix('python')}")
    site = usr / "lib" / "python3" / "dist-packages"
    site.mkdir(parents=True)
    (site / "evil.pth").write_text(f"import os; open('{other_user_dir}/ran-as-' + str(os.getuid()), 'w')\n")
    for path in [other_user_dir / "py", *(other_user_dir / "py").rglob("*")]:
        os.chown(path, other_user.uid, other_user.gid, follow_symlinks=False)
    runs = subprocess.run([str(exe), "-c", "pass"], capture_output=True, **other_user.popen_kwargs())
    if runs.returncode != 0:
        pytest.skip(f"{other_user.name} cannot run the 3.14 build (make it readable: chmod -R a+rX)")
    patient = start_patient(str(exe), "loop", 30, other_user)
    try:
        assert (other_user_dir / f"ran-as-{other_user.uid}").exists(), "the .pth file is not on this Python's path"
        doctor = run_cli("attach", str(patient.pid), "--out", str(shared_out), "--duration", "3", timeout=180)
    finally:
        stop(patient)
    assert not (other_user_dir / "ran-as-0").exists(), "root ran the patient user's .pth file"
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    rec = target(shared_out)
    assert rec["installed_at"] is not None and rec["method"] == "remote_exec", rec


# -- issue 11 item 3: an injection nothing in __main__ can break --------------------------------
def _attach_and_check(python: str, out: Path, method: str, mode: str = "shadow") -> None:
    """Hooks in and out of a patient whose __main__ shadows the names, which then ends normally.

    The patient works until the doctor is done (its stdin closed, 150 s at most): with a fixed 10 s
    beside two busy programs, gdb got in after it had ended and the hooks never went in."""
    patient = start_patient(python, mode, 150, until_eof=True)
    try:
        doctor = run_cli("attach", str(patient.pid), "--out", str(out), "--duration", "3", timeout=180)
        rest, err = patient.communicate(timeout=120)
    finally:
        stop(patient)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    rec = target(out)
    assert rec["method"] == method and rec["error"] is None and rec["installed_at"] is not None, rec
    assert rec["detached"] is True, rec
    assert patient.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert json.loads(rest.strip().splitlines()[-1])["done"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shadow", "no-builtins"])
@pytest.mark.gdb_inject
def test_a_main_that_shadows_every_builtin_name_still_gets_the_hooks_under_gdb(tmp_path: Path, mode: str):
    _attach_and_check(sys.executable, tmp_path / "run", "gdb", mode)


@pytest.mark.slow
@pytest.mark.skipif(PY314 is None, reason="needs a CPython 3.14 (GPUDOCTOR_TEST_PYTHON314 or python3.14 on PATH)")
def test_a_main_that_shadows_every_builtin_name_still_gets_the_hooks_under_remote_exec(tmp_path: Path):
    assert PY314 is not None
    _attach_and_check(PY314, tmp_path / "run", "remote_exec")


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_a_failed_bootstrap_says_why_in_an_info_finding(tmp_path: Path):
    patient = start_patient(sys.executable, "refuse", 30)
    try:
        doctor = run_cli("attach", str(patient.pid), "--out", str(tmp_path / "run"), "--duration", "3", timeout=180)
    finally:
        stop(patient)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    why = "import of gpudoctor.attach.payload halted; None in sys.modules"
    assert why in (target(tmp_path / "run")["error"] or "")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    infos = [json.dumps(f) for f in report["findings"] if f["severity"] == "info"]
    assert any(why in f and "did not run the injected code" not in f for f in infos), infos


def test_a_state_folder_planted_by_someone_else_is_refused_in_one_line(other_user: OtherUser):
    planted = Path(tempfile.gettempdir()) / f"gpudoctor-{other_user.uid}"
    if planted.exists():
        pytest.skip(f"{planted} exists already")
    planted.mkdir(mode=0o777)  # root's, writable by all: another user's doctor must not keep locks there
    try:
        out = subprocess.run([other_user.python, "-c", "from gpudoctor.attach import scratch; scratch.state_dir()"],
                             capture_output=True, text=True, env={"PATH": os.defpath, "PYTHONPATH": str(ROOT)},
                             cwd="/", **other_user.popen_kwargs())
    finally:
        planted.rmdir()
    assert out.returncode != 0 and "UserError" in out.stderr and "belongs to uid 0" in out.stderr, out.stderr
