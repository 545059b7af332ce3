"""Shared fixtures: run real probes under the real CLI, once per session each."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "probes"
# Every report the suite writes is indexed in a history of its own, never in the user's data folder
# (docs/history.md). Set on import, before any test module copies os.environ into a child's env.
_HISTORY_DIR = tempfile.mkdtemp(prefix="gpudoctor-test-history-")
os.environ["GPUDOCTOR_HISTORY"] = os.path.join(_HISTORY_DIR, "history.sqlite3")


@dataclass
class ProbeRun:
    folder: Path
    report: dict[str, Any]
    truth: dict[str, Any]
    returncode: int
    stderr: str
    truth_path: Path

    def finding(self, rule: str) -> dict[str, Any] | None:
        return next((f for f in self.report["findings"] if f["rule"] == rule), None)

    @property
    def top(self) -> dict[str, Any]:
        return self.report["findings"][0]


def gpudoctor_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpudoctor", *args]


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a ``gpudoctor`` command runs in under test: this checkout first on the path,
    no run folder inherited from the caller, then ``env``."""
    full_env = dict(os.environ)
    full_env.pop("GPUDOCTOR_RUN_DIR", None)
    full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    if env:
        full_env.update(env)
    return full_env


def run_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpudoctor_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=cli_env(env), cwd=cwd or ROOT)


def cli(*args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``gpudoctor ARGS`` as :func:`run_cli` runs it, but called in this process: ``cli.main(argv)``
    with its stdout and stderr captured, ``--help``'s exit caught, and the working folder, the
    environment and ``sys.excepthook`` put back after. For the commands that only parse, read and
    render (argument errors, ``report``, ``diff``, ``check``, ``export``): an interpreter start each
    bought nothing there. Commands that run a training, and the tests where the process itself is
    the point (the console entry, signals, what a fresh interpreter imports), keep :func:`run_cli`."""
    import io

    from gpudoctor import cli as gpudoctor_cli

    out, err = io.StringIO(), io.StringIO()
    old_env, old_cwd, old_hook = dict(os.environ), Path.cwd(), sys.excepthook
    os.environ.pop("GPUDOCTOR_RUN_DIR", None)
    os.environ.update(env or {})
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = gpudoctor_cli.main(list(args))
            except SystemExit as exc:  # argparse's --help and --version
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.excepthook = old_hook
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return subprocess.CompletedProcess(["gpudoctor", *args], code, out.getvalue(), err.getvalue())


GLOO_ABORT = "terminate called without an active exception"
RANK_ABORT = "Signal 6 (SIGABRT) received by PID"  # torchrun's summary of a rank that aborted


def once_more_on_gloo_abort(job: Callable[[], subprocess.CompletedProcess[str]],
                            fresh: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The job, and once more if a gloo rank aborted in torch's C++ (std::terminate, SIGABRT).

    The bare 2-rank job alone did so once in CI (stop 47: rank 0 two seconds in, no doctor anywhere),
    and a doctored one once (a clean-clone CI of cf8bbe4: rank 1 SIGABRT at ``destroy_process_group``
    after its 5 steps); here neither did in 100 runs (60 quiet, 40 beside two busy loops), nor 12 doctored
    and 12 bare runs of that job: torch's, not the doctor's. One rerun: an abort the doctor caused every
    time still fails the second. ``fresh``: the job's output folder, removed before the rerun so what
    is read after is the rerun's recording, not the aborted one's.
    """
    done = job()
    if done.returncode != 0 and (GLOO_ABORT in done.stderr or RANK_ABORT in done.stderr):
        print(f"a gloo rank aborted ({GLOO_ABORT!r}); running the job once more")
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        done = job()
    return done


def run_probe(tmp: Path, name: str, *probe_args: str, launcher: list[str] | None = None,
              doctor_args: tuple[str, ...] = ()) -> ProbeRun:
    folder = tmp / f"run-{name}"
    truth_path = tmp / f"truth-{name}.json"
    launch = launcher or [sys.executable]

    def job() -> subprocess.CompletedProcess[str]:
        return run_cli("run", "--out", str(folder), *doctor_args, "--", *launch, str(PROBES / f"{name}.py"),
                       "--truth", str(truth_path), *probe_args)

    proc = once_more_on_gloo_abort(job, fresh=folder) if launcher else job()
    report = json.loads((folder / "report.json").read_text())
    truth: dict[str, Any] = json.loads(truth_path.read_text()) if truth_path.exists() else {}
    return ProbeRun(folder, report, truth, proc.returncode, proc.stderr, truth_path)


_cache: dict[tuple[str, ...], ProbeRun] = {}


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this pytest run sees: the session's base temp folder, or under
    pytest-xdist the folder that holds every worker's (``pytest-of-USER/pytest-N``)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _shared_probe(root: Path, key: tuple[str, ...], run: Any) -> ProbeRun:
    """The run for ``key``, made once per pytest run however many xdist workers ask: the first takes
    the key's lock and runs it, writing what the tests read beside the folder; the others wait on the
    lock and read that back."""
    import fcntl
    import hashlib

    slot = root / "probe-runs" / hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    slot.mkdir(parents=True, exist_ok=True)
    done = slot / "probe-run.json"
    with (slot / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            made: ProbeRun = run(slot)
            done.write_text(json.dumps({"folder": str(made.folder), "truth_path": str(made.truth_path),
                                        "returncode": made.returncode, "stderr": made.stderr}))
    saved = json.loads(done.read_text())
    folder, truth_path = Path(saved["folder"]), Path(saved["truth_path"])
    truth: dict[str, Any] = json.loads(truth_path.read_text()) if truth_path.exists() else {}
    return ProbeRun(folder, json.loads((folder / "report.json").read_text()), truth, saved["returncode"],
                    saved["stderr"], truth_path)


@pytest.fixture(scope="session")
def probe_run(tmp_path_factory: pytest.TempPathFactory):
    """``probe_run(name, *args)``: the probe's run under ``gpudoctor run``, made once per pytest run
    (shared by the xdist workers too) and read-only: a test that changes the folder copies it first."""
    root = _shared_root(tmp_path_factory)

    def get(name: str, *args: str, **kwargs: Any) -> ProbeRun:
        key = (name, *args, *kwargs.get("doctor_args", ()), *kwargs.get("launcher", ()))
        if key not in _cache:
            _cache[key] = _shared_probe(root, key, lambda slot: run_probe(slot, name, *args, **kwargs))
        return _cache[key]

    return get


def within(measured: float | None, truth: float | None, rel: float = 0.25, abs_pts: float = 0.05) -> bool:
    """The acceptance bar: within 25% relative or 5 points of the probe's own ground truth."""
    if measured is None or truth is None:
        return False
    return abs(measured - truth) <= max(rel * abs(truth), abs_pts)


# --- another local user: the multi-user security tests -------------------------------------

TEST_USER = "gpudoctor-patient"


@dataclass(frozen=True)
class OtherUser:
    """An unprivileged local account: the patient's user, or an attacker, beside a root doctor."""

    name: str
    uid: int
    gid: int
    python: str  # an interpreter this user can run (root's own venv sits under a 0700 /root)

    def popen_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`subprocess.Popen` that run the child as this user only."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o022}


@pytest.fixture(scope="session")
def other_user() -> OtherUser:
    """An unprivileged user, created when the suite runs as root (CI does); skipped otherwise."""
    import pwd
    import shutil

    if os.geteuid() != 0:
        pytest.skip("multi-user security tests need root to create an unprivileged user")
    try:
        entry = pwd.getpwnam(TEST_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            pytest.skip("multi-user security tests need useradd to create an unprivileged user")
        subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(TEST_USER)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    if python is None:
        pytest.skip("multi-user security tests need a system python3 another user can run")
    return OtherUser(TEST_USER, entry.pw_uid, entry.pw_gid, python)


@pytest.fixture
def other_user_dir(other_user: OtherUser):
    """A fresh folder in /tmp owned by ``other_user`` (pytest's tmp_path sits under a 0700 root folder)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpudoctor-other-", dir="/tmp"))
    os.chown(path, other_user.uid, other_user.gid)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gdb_inject: loads the hooks into a live process with gdb (skipped, with "
                            "gdb's reason, where gdb cannot call into a process: tests/gdb_probe.py)")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HISTORY_DIR, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Where the suite's time goes (issue #35): with GPUDOCTOR_TEST_CPU_LOG set, one JSON line per test
    (its wall time and the CPU of this process and of the children it reaped), summed by file with
    ``python -m tests.cpu_by_file LOG``."""
    log = os.environ.get("GPUDOCTOR_TEST_CPU_LOG")
    if not log:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    wall0, cpu0 = time.monotonic(), cpu()
    yield
    line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall0, 3), "cpu_s": round(cpu() - cpu0, 3)}
    with open(log, "a") as out:
        out.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files marked ``slow`` first, each file's tests in their order: two xdist workers (the README's
    command, ``--dist loadfile``) then end on short files together, not one on a long file alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gdb_inject") is not None:
        from tests.gdb_probe import gdb_cannot_inject

        why = gdb_cannot_inject()
        if why is not None:
            pytest.skip(why)


@contextlib.contextmanager
def hooks_in(folder: Path) -> Iterator[None]:
    """The in-process hooks installed into ``folder`` for the block, with no profiler windows (their
    timing is not what these tests look at), then removed and the environment put back."""
    from gpudoctor import hooks

    old = os.environ.get("GPUDOCTOR_PROFILE_WINDOW")
    os.environ["GPUDOCTOR_PROFILE_WINDOW"] = "off"
    try:
        hooks.install(folder)
        yield
    finally:
        hooks.uninstall()
        if old is None:
            os.environ.pop("GPUDOCTOR_PROFILE_WINDOW", None)
        else:
            os.environ["GPUDOCTOR_PROFILE_WINDOW"] = old
