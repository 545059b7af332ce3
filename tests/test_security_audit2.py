"""Issue 26, "Security, second audit": an unprivileged local user against a root-run doctor.

Finding 2: a tracker log dir the patient swapped for a link to a root folder is never written.
Finding 3: a tracker store named by another user's process (``sqlite:////root/x.db``, a W&B
``root_dir``) gets nothing from a root doctor; the report says why.
Finding 4: a run folder renamed and replaced by a link while ``report`` reads it redirects no read
and no write (one descriptor, ``O_NOFOLLOW``); ``check``/``diff``/``export`` read through the same door.
Finding 5: readers have a budget (bytes and lines per file and per folder, batch lengths), a sparse
file is read by its data only, and the hooks write a bounded sample of a batch's lengths.

Multi-user tests create an unprivileged user when run as root (CI, this machine) and skip otherwise.
Nothing here writes a large file: budgets are lowered for the test, and big files are sparse.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording import read
from gpudoctor.recording.read import read_events
from gpudoctor.recording.store import RunFolder, load_recording
from tests.recording_builder import T0, RecordingBuilder

DATA = Path(__file__).parent / "data"
VICTIM_TEXT = "# root's own file\n"


def _as(user: Any, code: str, *argv: str) -> None:
    subprocess.run([user.python, "-c", code, *argv], check=True, **user.popen_kwargs())


def _chown_tree(root: Path, user: Any) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


def _run(root: Path, steps: int, *, pid: int = 100) -> Path:
    b = RecordingBuilder(root, cores=8, duration_s=60.0)
    rows = b.process(pid=pid)
    b.training_loop(rows, start_s=1.0, steps=steps, compute_s=0.05, wait_s=0.02)
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=100.0)
    return b.write()


def _events_of(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and "events.out.tfevents" in p.name]


# -- finding 2: a log dir swapped for a link -------------------------------------------------


def test_a_log_dir_swapped_for_a_link_to_a_root_folder_gets_no_event_file(tmp_path, other_user, other_user_dir):
    """The patient made ``w/tb`` (SummaryWriter), then swapped it for a link to a root-only folder
    (``/etc/cron.d`` in the audit). Before: the check resolved the link, saw root's folder, wrote there."""
    from gpudoctor.trackers import add_to_trackers

    cron = tmp_path / "cron.d"
    cron.mkdir(mode=0o755)
    work = other_user_dir / "w"
    _as(other_user, "import os, sys; w, target = sys.argv[1:]; os.makedirs(w + '/tb'); "
                    "os.rename(w + '/tb', w + '/tb.old'); os.symlink(target, w + '/tb')", str(work), str(cron))
    report = json.loads((DATA / "report_sample.json").read_text())
    events = {7: [{"k": "tracker", "t": 1.0, "kind": "tensorboard", "log_dir": str(work / "tb")}]}
    assert add_to_trackers(report, tmp_path, events)  # owners unknown: the folder walk alone must refuse it
    (entry,) = report["trackers"]
    assert entry["status"] == "skipped", entry
    assert f"uid {other_user.uid}" in entry["detail"] or "link" in entry["detail"], entry
    assert list(cron.iterdir()) == []  # no event file in root's folder
    assert list((work / "tb.old").iterdir()) == []


def test_the_folder_walk_follows_only_links_root_or_the_doctor_made(tmp_path):
    from gpudoctor.trackers import folders

    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "mine").symlink_to(real)  # the doctor's own link, in its own folder: followed
    checked = folders.open_checked(str(tmp_path / "mine"))
    assert not isinstance(checked, str), checked
    fd, walked = checked
    os.close(fd)
    assert walked == str(real)
    if os.geteuid() == 0:
        os.lchown(tmp_path / "mine", 12345, 12345)  # a link another user made: refused, whatever it points at
        why = folders.problem(tmp_path / "mine")
        assert why is not None and "link made by uid 12345" in why


# -- finding 3: tracker stores another user named --------------------------------------------


def _patient_run(other_user: Any, folder: Path, tracker: dict[str, Any]) -> Path:
    """A run folder as a root ``attach`` leaves it: ``events/`` and the events file are the patient's."""
    run = _run(folder, steps=30)
    with open(run / "events" / "100.jsonl", "a") as fh:
        fh.write(json.dumps({"k": "tracker", "t": T0 + 2, **tracker}) + "\n")
    events = run / "events"
    _chown_tree(events, other_user)
    return run


@pytest.mark.parametrize("kind", ["mlflow", "tensorboard", "wandb"])
def test_a_tracker_store_named_by_another_users_process_gets_nothing(tmp_path, other_user, kind):
    from gpudoctor.pipeline import finish
    from gpudoctor.report.build import ReportOptions

    store = tmp_path / "root-only"
    store.mkdir(mode=0o700)
    db = store / "x.db"
    db.write_bytes(b"")
    db.chmod(0o600)
    tracker = {
        "mlflow": {"kind": "mlflow", "run_id": "r1", "experiment_id": "0", "tracking_uri": f"sqlite:///{db}",
                   "artifact_uri": str(store / "artifacts")},
        "tensorboard": {"kind": "tensorboard", "log_dir": str(store)},
        "wandb": {"kind": "wandb", "run_id": "w1", "project": "p", "mode": "offline", "root_dir": str(store)},
    }[kind]
    run = _patient_run(other_user, tmp_path / "run", tracker)
    report = finish(run, ReportOptions(), trackers=True)
    (entry,) = report["trackers"]
    assert entry["status"] == "skipped" and f"uid {other_user.uid}" in entry["detail"], entry
    assert any(f"uid {other_user.uid}" in n for n in report["notes"])
    assert sorted(p.name for p in store.iterdir()) == ["x.db"] and db.stat().st_size == 0  # nothing created


def test_the_doctors_own_tracker_events_are_still_added_to(tmp_path):
    """The owner check skips only another user's events: a run of the doctor's own user still gets its figures."""
    pytest.importorskip("torch.utils.tensorboard")
    from gpudoctor.pipeline import finish
    from gpudoctor.report.build import ReportOptions

    log_dir = tmp_path / "tb"
    log_dir.mkdir(mode=0o755)
    run = _run(tmp_path / "run", steps=30)
    with open(run / "events" / "100.jsonl", "a") as fh:
        fh.write(json.dumps({"k": "tracker", "t": T0 + 2, "kind": "tensorboard", "log_dir": str(log_dir)}) + "\n")
    report = finish(run, ReportOptions(), trackers=True)
    (entry,) = report["trackers"]
    assert entry["status"] == "added", entry
    assert len(_events_of(log_dir)) == 1


# -- finding 4: a run folder swapped while report reads it -----------------------------------


@pytest.fixture
def swap_pair(tmp_path, other_user, other_user_dir):
    """The patient's run folder (50 steps) and a root-only one (7 steps, with root's report.md)."""
    theirs = _run(other_user_dir / "run", steps=50)
    _chown_tree(theirs, other_user)
    root_only = _run(tmp_path / "root-only" / "run", steps=7)
    (tmp_path / "root-only").chmod(0o700)
    (root_only / "report.md").write_text(VICTIM_TEXT)
    return theirs, root_only, other_user


def _swap_after_meta(monkeypatch, folder: Path, target: Path, user: Any) -> None:
    """As the patient: once the doctor has read meta.json, rename the folder and put a link in its place
    (what the audit did by slowing the reader with a large events file)."""
    original = RunFolder.read_meta
    done: list[bool] = []

    def read_meta(self: RunFolder) -> dict[str, Any]:
        meta = original(self)
        if not done:
            done.append(True)
            _as(user, "import os, sys; f, t = sys.argv[1:]; os.rename(f, f + '.moved'); os.symlink(t, f)",
                str(folder), str(target))
        return meta

    monkeypatch.setattr(RunFolder, "read_meta", read_meta)


def test_report_of_a_folder_swapped_for_a_link_reads_and_writes_only_the_folder_it_opened(swap_pair, monkeypatch):
    from gpudoctor.commands import report as report_command

    theirs, root_only, user = swap_pair
    _swap_after_meta(monkeypatch, theirs, root_only, user)
    args = argparse.Namespace(input=theirs, output=None, price_per_gpu_hour=None, gpus=None, json=False)
    assert report_command.main(args) == 0
    assert (root_only / "report.md").read_text() == VICTIM_TEXT  # before: replaced by the report
    assert not (root_only / "report.json").exists() and not (root_only / "report.html").exists()
    moved = theirs.parent / "run.moved"
    written = json.loads((moved / "report.json").read_text())
    assert written["steps"]["count"] == 50  # the folder opened, not root's 7-step one behind the link
    assert stat.S_IMODE((moved / "report.json").stat().st_mode) == 0o600


def test_check_and_diff_read_the_folder_they_opened(swap_pair, monkeypatch):
    from gpudoctor.report.load import load_report

    theirs, root_only, user = swap_pair
    _swap_after_meta(monkeypatch, theirs, root_only, user)
    assert load_report(theirs)["steps"]["count"] == 50  # before: root's events, read through the new link


def test_a_run_folder_that_is_a_link_is_refused_in_one_line(tmp_path):
    from gpudoctor.common.errors import UserError
    from gpudoctor.report.load import load_report

    run = _run(tmp_path / "run", steps=5)
    (tmp_path / "latest").symlink_to(run)
    with pytest.raises(UserError, match="symbolic link"):
        load_report(tmp_path / "latest")


def test_a_samples_or_events_folder_planted_as_a_link_is_not_followed(tmp_path):
    run = _run(tmp_path / "run", steps=20)
    other = _run(tmp_path / "other", steps=9)
    os.rename(run / "events", run / "events.real")
    (run / "events").symlink_to(other / "events")
    rec = load_recording(run)
    assert rec.loops == {}  # other's 9 steps are not read through the link
    assert any("events/ skipped" in n and "symbolic link" in n for n in rec.notes), rec.notes


# -- finding 5: readers have a budget -------------------------------------------------------


def _steps_file(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"k": "step", "t": T0 + i * 0.01, "n": i + 1}) + "\n" for i in range(n)))


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_sparse_events_file_is_read_by_its_data_only(tmp_path):
    """2 GiB long, a few kB on disk. Before: read whole (4 GiB took 14 s; larger ones hours)."""
    path = tmp_path / "events" / "1.jsonl"
    path.parent.mkdir()
    head = "".join(json.dumps({"k": "step", "t": T0 + i, "n": i + 1}) + "\n" for i in range(5))
    with open(path, "wb") as fh:
        fh.write(head.encode())
        fh.truncate(2 * 2**30)
        fh.seek(2 * 2**30)
        fh.write(b"\n" + head.encode())
    if os.stat(path).st_blocks * 512 > 2**20:
        pytest.skip("this filesystem does not keep sparse files sparse")
    before = _rchar()
    got = read_events(path)
    assert _rchar() - before < 64 * 2**20  # bytes actually read: the data, never the 2 GiB of holes
    assert len(got.loop.steps) == 10 and got.bad == 1  # the hole breaks one line, counted
    assert any("line" in n for n in got.notes), got.notes


def test_an_events_file_is_read_up_to_its_byte_budget_and_the_report_says_so(tmp_path, monkeypatch):
    run = _run(tmp_path / "run", steps=2_000)  # ~170 kB of events
    monkeypatch.setattr(read, "MAX_EVENT_FILE_BYTES", 64 * 2**10, raising=False)
    from gpudoctor.report.build import ReportOptions, build_report

    rec = load_recording(run)
    steps = len(rec.loops[100].steps)
    assert 0 < steps < 2_000
    assert any("events/100.jsonl: read only up to 64 KiB (the byte budget)" in n for n in rec.notes), rec.notes
    report = build_report(rec, ReportOptions())  # partial data still makes a report
    assert report["steps"]["count"] == steps
    assert any("byte budget" in n for n in report["notes"])


def test_an_events_file_is_read_up_to_its_line_budget(tmp_path, monkeypatch):
    path = tmp_path / "events" / "1.jsonl"
    _steps_file(path, 5_000)
    monkeypatch.setattr(read, "MAX_EVENTS_PER_FILE", 1_000, raising=False)
    got = read_events(path)
    assert len(got.loop.steps) == 1_000
    assert any("1,000 lines (the line budget)" in n for n in got.notes), got.notes


def test_a_folders_events_files_share_one_budget(tmp_path, monkeypatch):
    root = tmp_path / "run"
    _run(root, steps=10)
    for pid in (201, 202, 203):
        _steps_file(root / "events" / f"{pid}.jsonl", 1_000)  # ~45 kB each
    monkeypatch.setattr(read, "MAX_FOLDER_EVENT_BYTES", 80 * 2**10, raising=False)
    monkeypatch.setattr(read, "MAX_FOLDER_EVENTS", 10**9, raising=False)
    rec = load_recording(root)
    total = sum(len(loop.steps) for loop in rec.loops.values())
    assert total < 3_010
    assert sum("the byte budget" in n for n in rec.notes) >= 1, rec.notes


def test_a_batch_line_keeps_a_bounded_sample_of_its_lengths_and_exact_figures(tmp_path):
    """Before: every length of every batch was kept (50 lines of 1.9 M lengths took 2.25 GB)."""
    from gpudoctor.analysis.process import dynamic_padding_tokens

    lengths = [(i * 7919) % 500 + 1 for i in range(200_000)]
    seq = 512
    batch = {"k": "batch", "t": T0, "tokens": len(lengths) * seq, "pad": len(lengths) * seq - sum(lengths),
             "seq_len": seq, "lengths": lengths}
    path = tmp_path / "events" / "1.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(batch) + "\n")
    (got,) = read_events(path).records.batches
    assert len(got["lengths"]) <= 1024
    assert got["rows"] == 200_000 and got["lengths_max"] == max(lengths)
    assert got["tokens"] - got["pad"] == sum(lengths)  # the exact sum is kept
    # the padding figures use the exact row count and longest row, not the sample's
    assert dynamic_padding_tokens([got]) == dynamic_padding_tokens([batch])


def test_a_folder_keeps_a_bounded_number_of_batch_lengths(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "MAX_FOLDER_LENGTHS", 3_000, raising=False)
    path = tmp_path / "events" / "1.jsonl"
    path.parent.mkdir()
    with open(path, "w") as fh:
        for i in range(10):
            lengths = [10 + (i + j) % 20 for j in range(1_000)]
            fh.write(json.dumps({"k": "batch", "t": T0 + i, "tokens": 32_000, "pad": 32_000 - sum(lengths),
                                 "seq_len": 32, "lengths": lengths}) + "\n")
    batches = read_events(path).records.batches
    assert len(batches) == 10  # every batch still counts...
    assert sum(len(b.get("lengths") or []) for b in batches) <= 3_000  # ...with at most the budget of lengths
    assert all(b.get("rows", len(b.get("lengths") or [])) == 1_000 for b in batches)


def test_the_hook_writes_a_bounded_sample_of_a_large_batchs_lengths():
    """At the source: a 5,000-row batch wrote every row's length (a 1 M-row one, 2 MB a line)."""
    torch = pytest.importorskip("torch")
    from gpudoctor.hooks.torch_hooks import padding_event

    rows, seq = 5_000, 64
    lengths = torch.arange(rows) % seq + 1
    mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).long()
    event = padding_event({"attention_mask": mask, "input_ids": mask}, 0)
    assert event is not None
    assert len(event["lengths"]) <= 1024
    assert event["rows"] == rows and event["lengths_max"] == seq
    assert event["pad"] == rows * seq - int(lengths.sum())
    assert len(json.dumps(event)) < 16_000


def test_a_downsampled_sample_file_holds_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    """2,000 sampled lines each just under the 4 MiB line cap would be 8 GB held at once."""
    from gpudoctor.recording.read import read_samples
    from gpudoctor.recording.validate import clean_host_row

    monkeypatch.setattr(read, "FULL_READ_BYTES", 64 * 2**10, raising=False)
    monkeypatch.setattr(read, "MAX_SAMPLE_BYTES", 32 * 2**10, raising=False)
    path = tmp_path / "samples" / "host.jsonl"
    path.parent.mkdir()
    pad = "x" * 900
    path.write_text("".join(json.dumps({"t": T0 + i, "cpu_total_pct": 5.0, "pad": pad}) + "\n" for i in range(400)))
    notes: list[str] = []
    rows, _ = read_samples(path, clean_host_row, max_rows=200, notes=notes)
    assert 0 < len(rows) < 60  # ~32 KiB of ~1 kB rows (+ the last row), not 200
    assert any("samples/host.jsonl: read only up to 32 KiB of sampled lines" in n for n in notes), notes


def test_an_error_about_a_folder_read_through_its_descriptor_names_the_folder(tmp_path):
    from gpudoctor.common.errors import UserError
    from gpudoctor.report.load import load_report

    run = _run(tmp_path / "run", steps=5)
    (run / "meta.json").write_text(json.dumps({"schema": "gpudoctor.run/0"}))
    with pytest.raises(UserError) as err:
        load_report(run)
    assert str(run / "meta.json") in str(err.value) and "/proc/self/fd" not in str(err.value)
