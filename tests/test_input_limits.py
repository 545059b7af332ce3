"""Untrusted run folders: planted FIFOs and links, a stranger's files, bombs of every size.

A run folder handed to ``gpudoctor report`` (or an ``events/`` the patient's user can write
under ``attach``) may hold anything. The readers must never block, never follow a link, and
never hold more than a capped line in memory; each refusal is one counted note.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

from gpudoctor.recording.read import read_events, read_samples
from gpudoctor.recording.validate import clean_host_row
from tests.conftest import ROOT, cli, run_cli
from tests.test_bad_input import assert_one_line_error

SAMPLE_REPORT = ROOT / "tests" / "data" / "report_sample.json"
T0 = 1_700_000_000.0
STEPS = "".join(json.dumps({"k": "step", "t": T0 + i, "dt": 0.1, "n": i}) + "\n" for i in range(5))


def _as(user, *code: str, timeout: float = 30) -> None:
    """Run Python ``code`` as ``user`` (the attacker planting things)."""
    subprocess.run([user.python, "-c", "\n".join(code)], check=True, timeout=timeout, **user.popen_kwargs())


def _load_in_child(folder: Path, timeout: float = 30) -> dict:
    """Load ``folder``'s events and samples in a child with a deadline: a reader that blocks fails."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from gpudoctor.recording.read import read_events, read_samples
        from gpudoctor.recording.validate import clean_host_row
        root = Path({str(folder)!r})
        out = {{"events": {{}}, "notes": []}}
        for p in sorted((root / "events").glob("*.jsonl")):
            got = read_events(p)
            out["events"][p.name] = [len(got.loop.steps), got.bad]
            out["notes"] += getattr(got, "notes", [])  # (getattr: so the old readers show their hang)
        notes = []
        rows, bad = read_samples(root / "samples" / "host.jsonl", clean_host_row, notes=notes)
        out["host"] = [len(rows), bad]
        out["notes"] += notes
        print(json.dumps(out))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_fifo_planted_in_events_is_skipped_not_waited_on(other_user, other_user_dir):
    run = other_user_dir / "run"
    _as(other_user,
        "import os",
        f"run = {str(run)!r}",
        "os.makedirs(run + '/events'); os.makedirs(run + '/samples')",
        f"open(run + '/events/100.jsonl', 'w').write({STEPS!r})",
        "os.mkfifo(run + '/events/200.jsonl')",
        "os.mkfifo(run + '/samples/host.jsonl')")
    got = _load_in_child(run)  # before the fix: blocked forever opening the FIFO (TimeoutExpired)
    assert got["events"] == {"100.jsonl": [5, 0], "200.jsonl": [0, 1]}  # the patient's own file is read
    assert got["host"] == [0, 1]
    notes = " ".join(got["notes"])
    assert "events/200.jsonl skipped: it is not a regular file" in notes
    assert "samples/host.jsonl skipped" in notes


def test_links_and_strangers_files_in_events_are_not_read(tmp_path, other_user, other_user_dir):
    secret = tmp_path / "secret.jsonl"  # root's: a link must not carry it into a report
    secret.write_text(STEPS)
    run = other_user_dir / "run"
    _as(other_user,
        "import os",
        f"run = {str(run)!r}",
        "os.makedirs(run + '/events')",
        f"os.symlink({str(secret)!r}, run + '/events/300.jsonl')")
    stranger = run / "events" / "400.jsonl"
    stranger.write_text(STEPS)
    os.chown(stranger, 4242, 4242)  # neither the doctor's user nor the folder's owner
    got = _load_in_child(run)
    assert got["events"] == {"300.jsonl": [0, 1], "400.jsonl": [0, 1]}
    notes = " ".join(got["notes"])
    assert "events/300.jsonl skipped: it is a symbolic link" in notes
    assert "events/400.jsonl skipped: it is owned by uid 4242" in notes


def _sparse_long_line(path: Path, size: int, after: str) -> None:
    """A ``size``-byte line of NULs (sparse: no disk, no memory to write it), then ``after``."""
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.seek(size)
        fh.write(b"\n" + after.encode())


def test_an_over_long_events_line_is_skipped_in_bounded_memory(tmp_path):
    path = tmp_path / "events" / "1.jsonl"
    path.parent.mkdir()
    _sparse_long_line(path, 64 * 2**20, STEPS)
    tracemalloc.start()
    try:
        got = read_events(path, max_line=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(got.loop.steps) == 5 and got.bad == 1  # the lines after it still count
    assert got.notes == ["events/1.jsonl: 1 line over the 1 MiB line cap skipped (gpudoctor never writes "
                         "one; the file is damaged or not gpudoctor's)"]
    assert peak < 40 * 2**20  # before: the whole 64 MiB line was held (and copied) while looking for its end


def test_an_over_long_sample_line_is_skipped_in_a_downsampled_read(tmp_path):
    path = tmp_path / "samples" / "host.jsonl"
    path.parent.mkdir()
    rows = "".join(json.dumps({"t": T0 + i, "cpu_total_pct": 5.0}) + "\n" for i in range(10))
    _sparse_long_line(path, 40 * 2**20, rows)  # past the full-read size: read at sampled offsets
    notes: list[str] = []
    tracemalloc.start()
    try:
        got, bad = read_samples(path, clean_host_row, notes=notes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got and got[-1]["t"] == T0 + 9
    assert bad >= 1 and "line cap" in notes[0]
    assert peak < 32 * 2**20


def test_a_report_json_over_the_cap_is_refused_before_it_is_read(tmp_path):
    from gpudoctor.commands.load import MAX_REPORT_BYTES

    big = tmp_path / "report.json"
    with open(big, "wb") as fh:  # sparse: just over the cap, costs no disk and no memory to write
        fh.write(b'{"schema": "gpudoctor.report/1", "pad": "')
        fh.truncate(MAX_REPORT_BYTES + 1)
    out = tmp_path / "out.md"
    proc = cli("report", str(big), "-o", str(out))
    line = assert_one_line_error(proc, 2)
    assert f"over the {MAX_REPORT_BYTES // 2**20} MiB cap" in line and "gpudoctor report FOLDER" in line
    assert not out.exists()


def test_a_fifo_or_link_as_report_json_is_refused_without_waiting(tmp_path, other_user, other_user_dir):
    secret = tmp_path / "secret.json"
    secret.write_text(SAMPLE_REPORT.read_text())  # root's: readable by root only
    _as(other_user,
        "import os",
        f"d = {str(other_user_dir)!r}",
        "os.makedirs(d + '/fifo'); os.mkfifo(d + '/fifo/report.json')",
        f"os.makedirs(d + '/link'); os.symlink({str(secret)!r}, d + '/link/report.json')")
    for folder, says in (("fifo", "not a regular file"), ("link", "symbolic link")):
        proc = run_cli("check", str(other_user_dir / folder), "--max-waste", "0.5", timeout=30)
        assert says in assert_one_line_error(proc, 2)  # before: the FIFO hung, the link was read


def test_report_on_a_folder_with_a_planted_fifo_finishes_and_says_why(other_user, other_user_dir):
    from tests.test_rules import stall_run

    run = stall_run(other_user_dir / "run", cores=8, cpu_total_pct=20.0).write()
    for path in [run, *run.rglob("*")]:
        os.chown(path, other_user.uid, other_user.gid)  # the whole folder is the other user's
    (run / "report.json").unlink(missing_ok=True)
    _as(other_user, "import os", f"os.mkfifo({str(run / 'events' / '999.jsonl')!r})")
    out = other_user_dir / "out.json"
    proc = run_cli("report", str(run), "-o", str(out), timeout=120)  # before: blocked on the FIFO
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(out.read_text())["notes"]
    assert any("events/999.jsonl skipped: it is not a regular file" in n for n in notes), notes
    assert json.loads(out.read_text())["steps"]["count"] > 100  # the patient's own events still count
