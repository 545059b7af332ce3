"""The doctor as root beside other users: an --out it does not own is refused, and nothing it
writes (recording, report, ``report -o``, ``diff -o``) goes through a planted link
(issue 12, findings 4 and 5)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli, run_cli
from tests.recording_builder import RecordingBuilder

VICTIM_TEXT = "# the victim's own file\n"
PLANTED = (".write-test", "meta.json.tmp", "report.json", "report.html", "report.md", "samples/host.jsonl")


def _victims(folder: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """One root-owned 0644 file per planted name, outside every folder the doctor writes."""
    folder.mkdir(exist_ok=True)
    out = {}
    for name in names:
        path = folder / name.replace("/", "_").lstrip(".")
        path.write_text(VICTIM_TEXT)
        path.chmod(0o644)
        out[name] = path
    return out


def _untouched(victims: dict[str, Path]) -> None:
    for name, path in victims.items():
        assert path.read_text() == VICTIM_TEXT, f"written through the planted {name}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, f"chmodded through the planted {name}"


def _one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gpudoctor: ")]
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _as(user, *argv: str) -> None:
    subprocess.run([user.python, "-c", *argv], check=True, **user.popen_kwargs())


def _plant(user, folder: Path, links: dict[str, Path]) -> None:
    """``user`` makes ``folder`` (0755) and plants each name in it as a symlink to its victim."""
    code = ("import os, sys, json\nfolder, links = sys.argv[1], json.loads(sys.argv[2])\n"
            "os.makedirs(os.path.join(folder, 'samples'), exist_ok=True)\n"
            "for name, target in links.items(): os.symlink(target, os.path.join(folder, name))")
    _as(user, code, str(folder), json.dumps({k: str(v) for k, v in links.items()}))


# -- finding 4: an --out that is not the doctor's -------------------------------------------

def test_an_out_made_by_another_user_is_refused(tmp_path, other_user, other_user_dir):
    victims = _victims(tmp_path / "victims", PLANTED)
    out = other_user_dir / "out"
    _plant(other_user, out, victims)
    line = _one_line(run_cli("run", "--out", str(out), "--", sys.executable, "-c", "pass"), 2)
    assert "--out" in line and str(out) in line and f"uid {other_user.uid}" in line
    _untouched(victims)
    assert not (out / "meta.json").exists()


def test_an_out_writable_by_others_is_refused(tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    line = _one_line(run_cli("run", "--out", str(out), "--", sys.executable, "-c", "pass"), 2)
    assert "--out" in line and "writable by other users" in line
    assert list(out.iterdir()) == []


def test_links_in_an_out_of_our_own_are_never_followed(tmp_path):
    victims = _victims(tmp_path / "victims", PLANTED)
    out = tmp_path / "out"
    (out / "samples").mkdir(parents=True, mode=0o700)
    out.chmod(0o700)
    for name, target in victims.items():
        (out / name).symlink_to(target)
    proc = run_cli("run", "--out", str(out), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    _untouched(victims)
    for name in ("meta.json", "report.json", "report.html", "report.md", "samples/host.jsonl"):
        st = os.lstat(out / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name


# -- finding 5: rendering a folder someone else handed over ----------------------------------

@pytest.fixture
def recording(tmp_path) -> Path:
    b = RecordingBuilder(tmp_path / "rec", cores=8, duration_s=20.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.1, wait_s=0.05)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    b.meta_extra = {"command": ["python", "train.py", "`touch /tmp/pwned`"]}
    return b.write()


def test_report_of_an_untrusted_folder_never_writes_through_its_links(tmp_path, recording, other_user,
                                                                       other_user_dir):
    victims = _victims(tmp_path / "victims", ("report.json", "report.html", "report.md"))
    folder = other_user_dir / "run"
    shutil.copytree(recording, folder)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, other_user.uid, other_user.gid)
    code = "import os, sys, json\nfor n, t in json.loads(sys.argv[2]).items(): os.symlink(t, os.path.join(sys.argv[1], n))"
    _as(other_user, code, str(folder), json.dumps({k: str(v) for k, v in victims.items()}))
    proc = run_cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    _untouched(victims)
    for name in victims:
        st = os.lstat(folder / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600


@pytest.mark.parametrize("ext", ["md", "html", "json"])
def test_report_and_diff_outputs_are_private(tmp_path, recording, ext):
    for argv in (("report", str(recording)), ("diff", str(recording), str(recording))):
        out = tmp_path / f"{argv[0]}.{ext}"
        proc = cli(*argv, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.stat().st_size > 0


@pytest.mark.parametrize("cmd", ["report", "diff"])
def test_report_and_diff_outputs_never_go_through_a_link(tmp_path, recording, cmd):
    victims = _victims(tmp_path / "victims", ("out.md",))
    out = tmp_path / "out.md"
    out.symlink_to(victims["out.md"])
    argv = (cmd, str(recording)) if cmd == "report" else (cmd, str(recording), str(recording))
    line = _one_line(cli(*argv, "-o", str(out)), 2)
    assert str(out) in line and "link" in line
    _untouched(victims)
