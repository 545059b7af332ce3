"""Run history: every report indexed, listed, and used as a baseline by ``check`` and ``diff``.

One real ``gpudoctor run`` of the tiny loop (two at once, into one database) gives the report the
other tests copy with varied figures and index through :func:`gpudoctor.history.index.record`.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.cli import main
from gpudoctor.history.entry import from_report
from gpudoctor.history.git import commit_of
from gpudoctor.history.index import record
from gpudoctor.history.store import History
from tests.conftest import PROBES, ROOT, gpudoctor_cmd


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[subprocess.CompletedProcess[str]]]:
    """Two real runs of the tiny loop started together, indexed into one history."""
    tmp = tmp_path_factory.mktemp("history-runs")
    db = tmp / "db" / "history.sqlite3"
    folders = [tmp / f"run-{i}" for i in range(2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(gpudoctor_cmd("run", "--out", str(f), "--history", str(db), "--name", f"tiny-{i}", "--",
                                            sys.executable, str(PROBES / "healthy.py"), "--steps", "20"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for i, f in enumerate(folders)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return db, folders, done


@pytest.fixture
def report(two_runs: tuple[Path, list[Path], Any]) -> dict[str, Any]:
    return json.loads((two_runs[1][0] / "report.json").read_text())


def _variant(report: dict[str, Any], folder: Path, p50_s: float, waste: float,
             command: list[str] | None = None) -> Path:
    """A copy of the real report in ``folder`` with its step time and wasted share changed."""
    r = copy.deepcopy(report)
    r["steps"]["step_time_s"] = {"p50": p50_s, "p90": p50_s * 1.2}
    r["cost"]["wasted_fraction"] = waste
    r["run"]["started_at"] = f"2026-01-01T00:00:00+00:00 {folder.name}"
    if command is not None:
        r["run"]["command"] = command
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(r))
    return folder


def _index(report: dict[str, Any], folder: Path, db: Path, p50_s: float, waste: float,
           **kwargs: Any) -> int:
    name = kwargs.pop("name", None)
    _variant(report, folder, p50_s, waste, **kwargs)
    entry_id = record(json.loads((folder / "report.json").read_text()), folder, db, name=name, quiet=True)
    assert entry_id is not None
    return entry_id


def test_two_real_runs_finishing_together_are_both_indexed_with_their_figures(two_runs):
    db, folders, procs = two_runs
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        assert "history: #" in proc.stderr
    with History(db, create=False) as history:
        entries = history.entries()
    assert sorted(e.name or "" for e in entries) == ["tiny-0", "tiny-1"]
    for entry in entries:
        report = json.loads((Path(entry.folder) / "report.json").read_text())
        assert entry.folder in {str(f) for f in folders}
        assert entry.steps_per_s == pytest.approx(1 / report["steps"]["step_time_s"]["p50"])
        assert entry.waste == report["cost"]["wasted_fraction"]
        assert entry.breakdown == report["breakdown"]
        assert entry.script == str(PROBES / "healthy.py") and entry.mode == "run"
        assert entry.host == report["run"]["host"]["hostname"]
        assert entry.git_commit == commit_of(ROOT)  # this checkout's, read from .git (None outside one)


def test_history_lists_newest_first_filters_by_script_and_prints_json(tmp_path, report, capsys):
    db = tmp_path / "h.sqlite3"
    ids = [_index(report, tmp_path / f"r{i}", db, 0.1, 0.1, command=["python", script])
           for i, script in enumerate(["train.py", "other.py", "train.py"])]
    assert main(["history", "--history", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["id", "when", "name"]
    assert [int(line.split()[0]) for line in lines[1:]] == ids[::-1]
    assert main(["history", "train.py", "--history", str(db), "--json", "--limit", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [ids[2]] and rows[0]["steps_per_s"] == pytest.approx(10.0)


def test_check_against_the_last_run_passes_within_the_bound_and_fails_saying_by_how_much(tmp_path, report, capsys):
    db = tmp_path / "h.sqlite3"
    _index(report, tmp_path / "base", db, 0.100, 0.10, name="main")
    _index(report, tmp_path / "ok", db, 0.102, 0.11)  # 2% slower, +1 point of waste
    assert main(["check", str(tmp_path / "ok"), "--baseline", "last", "--max-slowdown", "5%",
                 "--history", str(db)]) == 0
    assert "OK against #1 'main'" in capsys.readouterr().err
    _index(report, tmp_path / "slow", db, 0.125, 0.10)  # 8 steps/s: 20% slower than main's 10
    assert main(["check", str(tmp_path / "slow"), "--baseline", "main", "--max-slowdown", "0.05",
                 "--history", str(db)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "FAIL against #1 'main'" in err and "20.0% slower" in err
    _index(report, tmp_path / "wasteful", db, 0.100, 0.30)
    assert main(["check", str(tmp_path / "wasteful"), "--baseline", "1", "--history", str(db)]) == 1
    assert "+20.0 points" in capsys.readouterr().err


def test_check_baseline_refusals_are_one_line(tmp_path, report, capsys):
    db = tmp_path / "h.sqlite3"
    folder = tmp_path / "only"
    _index(report, folder, db, 0.1, 0.1)
    for argv, says in ((["--baseline", "last"], "no earlier run of"), (["--baseline", "nope"], "no run 'nope'"),
                       (["--baseline", "1"], "is the run being checked"),
                       (["--max-slowdown", "5%"], "add --baseline"), ([], "nothing to gate on")):
        assert main(["check", str(folder), *argv, "--history", str(db)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gpudoctor: ") and "\n" not in err and says in err, err


def test_diff_takes_history_ids(tmp_path, report, capsys):
    db = tmp_path / "h.sqlite3"
    before = _index(report, tmp_path / "before", db, 0.2, 0.3)
    after = _index(report, tmp_path / "after", db, 0.1, 0.1, name="fixed")
    out = tmp_path / "d.json"
    assert main(["diff", str(before), "fixed", "--history", str(db), "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["throughput_steps_per_s"]["before"] == pytest.approx(5.0)
    assert d["throughput_steps_per_s"]["after"] == pytest.approx(10.0)
    assert main(["diff", f"#{after}", "99", "--history", str(db)]) == 2
    assert "99, nor a run id or --name" in capsys.readouterr().err


def test_a_hundred_runs_then_history_check_and_diff(tmp_path, report, capsys):
    db = tmp_path / "h.sqlite3"
    for i in range(100):
        _index(report, tmp_path / f"r{i:03d}", db, 0.1 + 0.001 * i, 0.01 * (i % 50), name=f"n{i}")
    assert main(["history", "--history", str(db), "--all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == list(range(100, 0, -1))
    assert rows[0]["steps_per_s"] == pytest.approx(1 / 0.199)
    # #100 against #99 (last): 0.5% slower, +1 point of waste; against n0: 50% slower
    assert main(["check", str(tmp_path / "r099"), "--baseline", "last", "--history", str(db)]) == 0
    assert main(["check", str(tmp_path / "r099"), "--baseline", "n0", "--history", str(db)]) == 1
    assert "49.7% slower" in capsys.readouterr().err
    assert main(["diff", "1", "100", "--history", str(db), "-o", str(tmp_path / "d.json")]) == 0
    rate = json.loads((tmp_path / "d.json").read_text())["throughput_steps_per_s"]
    assert (rate["before"], rate["after"]) == (pytest.approx(10.0), pytest.approx(1 / 0.199))


def _index_after(barrier: Any, db: str, folder: str, report: dict[str, Any], count: int) -> None:
    barrier.wait()
    for i in range(count):
        r = copy.deepcopy(report)
        r["run"]["started_at"] = f"{folder}-{i}"
        assert record(r, Path(folder), Path(db), quiet=True) is not None


def test_writers_at_the_same_moment_lose_nothing(tmp_path, report):
    db = tmp_path / "h.sqlite3"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_index_after, args=(barrier, str(db), str(tmp_path / f"w{i}"), report, 25))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with History(db) as history:
        entries = history.entries()
    assert len(entries) == 100 and len({(e.folder, e.started_at) for e in entries}) == 100


def test_the_same_run_indexed_again_keeps_one_entry(tmp_path, report):
    db = tmp_path / "h.sqlite3"
    first = _index(report, tmp_path / "r", db, 0.1, 0.1, name="keep")
    again = record(json.loads((tmp_path / "r" / "report.json").read_text()), tmp_path / "r", db, quiet=True)
    with History(db) as history:
        entries = history.entries()
    assert again == first and len(entries) == 1 and entries[0].name == "keep"


def test_a_corrupt_history_is_moved_aside_in_one_line_and_the_run_indexed(tmp_path, report, capsys):
    db = tmp_path / "h" / "history.sqlite3"
    db.parent.mkdir(mode=0o700)
    db.write_bytes(b"this is not a database\n" * 200)
    db.chmod(0o600)
    assert _index(report, tmp_path / "r", db, 0.1, 0.1) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is corrupt" in err and "moved it to" in err
    aside = [p for p in db.parent.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    with History(db) as history:
        assert [e.id for e in history.entries()] == [1]


def test_the_history_is_private_and_a_folder_others_can_write_is_refused(tmp_path, report, capsys):
    db = tmp_path / "new" / "history.sqlite3"
    _index(report, tmp_path / "r", db, 0.1, 0.1)
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700 and stat.S_IMODE(db.stat().st_mode) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    folder = _variant(report, tmp_path / "r2", 0.1, 0.1)
    assert record(json.loads((folder / "report.json").read_text()), folder, shared / "h.sqlite3") is None
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not added to the history" in err and "writable by other users" in err
    assert not (shared / "h.sqlite3").exists()


def test_a_linked_history_file_is_never_followed(tmp_path, report, capsys):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "h").mkdir(mode=0o700)
    (tmp_path / "h" / "history.sqlite3").symlink_to(target)
    folder = _variant(report, tmp_path / "r", 0.1, 0.1)
    assert record(json.loads((folder / "report.json").read_text()), folder, tmp_path / "h" / "history.sqlite3") is None
    assert "symbolic link" in capsys.readouterr().err and target.read_text() == "keep"


def test_another_users_history_is_refused(tmp_path, report, other_user, capsys):
    folder = _variant(report, tmp_path / "r", 0.1, 0.1)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, other_user.uid, other_user.gid)
    assert record(json.loads((folder / "report.json").read_text()), folder, theirs / "h.sqlite3") is None
    assert f"belongs to uid {other_user.uid}" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "h.sqlite3").write_bytes(b"")
    os.chown(mine / "h.sqlite3", other_user.uid, other_user.gid)
    assert record(json.loads((folder / "report.json").read_text()), folder, mine / "h.sqlite3") is None
    assert f"belongs to uid {other_user.uid}" in capsys.readouterr().err


def test_no_history_and_off_write_nothing(tmp_path, two_runs, monkeypatch, capsys):
    db = tmp_path / "h.sqlite3"
    copied = tmp_path / "run"
    shutil.copytree(two_runs[1][0], copied)
    assert main(["report", str(copied), "--history", str(db), "--no-history"]) == 0
    monkeypatch.setenv("GPUDOCTOR_HISTORY", "off")
    assert main(["report", str(copied)]) == 0
    err = capsys.readouterr().err
    assert not db.exists() and "history: #" not in err and "not added" not in err


def test_git_commit_is_read_from_files_worktrees_and_packed_refs(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text("")
    assert commit_of(repo / "src" / "train.py") == sha
    other = sha[::-1]
    (repo / ".git" / "refs" / "heads" / "main").write_text(other + "\n")
    assert commit_of(repo / "src") == other
    wt_git = repo / ".git" / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text(sha + "\n")  # detached
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {wt_git}\n")
    assert commit_of(tmp_path / "wt") == sha
    assert commit_of(Path("/")) is None


def test_another_users_git_files_give_no_commit(tmp_path, other_user):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    os.chown(repo / ".git" / "HEAD", other_user.uid, other_user.gid)
    assert commit_of(repo) is None


def test_an_entry_takes_the_script_not_the_interpreter(report):
    for argv, script in ((["torchrun", "--nproc-per-node", "2", "train.py"], "train.py"),
                         (["python", "-m", "pkg.train"], "pkg.train"), (["./run.sh"], "./run.sh"),
                         (["gpudoctor", "replay", "cfg.yaml", "--target", "h100"], "cfg.yaml")):
        r = copy.deepcopy(report)
        r["run"]["command"] = argv
        assert from_report(r, Path("/nowhere"), git=False, cwd=Path("/nonexistent")).script == script
