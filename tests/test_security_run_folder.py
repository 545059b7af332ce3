"""The run folder's parent, and every write into the run folder (issue 34, row 1).

``run``, ``attach`` and ``try`` make ``reports/<mode>-<time>/`` in the current folder (or in
``--out``'s parent). Where another user can write that parent she can rename root's new folder
and put a link in its place (or plant the link before: ``reports -> /root/secret``), and every
write by path, the doctor's and the training's hooks', then lands where she chose. So such a
parent is refused in one line before anything is made, and the doctor holds the run folder open
and writes through that descriptor: a folder swapped after its creation redirects nothing.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.common.errors import UserError
from gpudoctor.launch import launcher
from gpudoctor.launch.recorder import default_out
from gpudoctor.recording.store import RunFolder
from tests.conftest import run_cli

SECRET = "root's own\n"


def _victim(folder: Path) -> Path:
    """A root-only folder (0700) holding one file: where she would like root to write."""
    folder.mkdir(mode=0o700)
    (folder / "secret.txt").write_text(SECRET)
    return folder


def _untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["secret.txt"], "written through her link"
    assert (victim / "secret.txt").read_text() == SECRET
    st = victim.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), "chmodded or chowned through her link"


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gpudoctor: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _as(user, code: str, *args: str) -> None:
    subprocess.run([user.python, "-c", code, *args], check=True, **user.popen_kwargs())


# -- a parent another user can write: refused before anything is made --------------------------

def test_a_run_started_in_her_folder_is_refused(other_user, other_user_dir):
    proc = run_cli("run", "--", sys.executable, "-c", "pass", cwd=other_user_dir)
    _refused(proc, str(other_user_dir), f"uid {other_user.uid}", "--out")
    assert list(other_user_dir.iterdir()) == []  # no reports/ made in her folder


@pytest.mark.parametrize("mode", ["run", "attach", "try"])
def test_no_default_folder_is_made_below_her_folder(other_user, other_user_dir, monkeypatch, mode):
    monkeypatch.chdir(other_user_dir)
    with pytest.raises(UserError, match=f"{other_user_dir} belongs to uid {other_user.uid}"):
        default_out(mode)
    assert list(other_user_dir.iterdir()) == []


def test_a_reports_link_she_planted_is_never_followed(tmp_path, other_user, other_user_dir):
    # no race: `reports -> a root-only folder` waits in her folder for root to run there
    victim = _victim(tmp_path / "victim")
    _as(other_user, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(victim),
        str(other_user_dir / "reports"))
    proc = run_cli("run", "--", sys.executable, "-c", "pass", cwd=other_user_dir)
    _refused(proc, "--out")
    _untouched(victim)


def test_an_out_through_her_link_in_tmp_is_refused(tmp_path, other_user):
    # /tmp is root's and sticky (fine), but a link in it that she made is never followed
    victim = _victim(tmp_path / "victim")
    link = Path("/tmp") / f"gpudoctor-her-link-{secrets.token_hex(4)}"
    _as(other_user, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(victim), str(link))
    try:
        proc = run_cli("run", "--out", str(link / "out"), "--", sys.executable, "-c", "pass")
        _refused(proc, str(link), f"link made by uid {other_user.uid}")
    finally:
        link.unlink()
    _untouched(victim)


def test_an_out_in_a_world_writable_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = run_cli("run", "--out", str(shared / "out"), "--", sys.executable, "-c", "pass")
    _refused(proc, str(shared), "writable by other users", "--out")
    assert list(shared.iterdir()) == []


def test_an_out_in_a_sticky_folder_of_roots_is_used(tmp_path):
    # like /tmp: others may write there, but cannot rename what is root's
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    proc = run_cli("run", "--out", str(sticky / "a" / "out"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    assert (sticky / "a" / "out" / "report.json").is_file()
    assert stat.S_IMODE((sticky / "a").stat().st_mode) & 0o022 == 0  # made as no one else's to write


# -- the run folder swapped for a link after it was made: every write goes to the real one ------

def _swap(out: Path, victim: Path) -> Path:
    """What she would do, between the folder's creation and the doctor's writes: move it, link in its place."""
    moved = out.with_name("moved")
    os.rename(out, moved)
    os.symlink(victim, out)
    return moved


def test_a_run_folder_swapped_for_a_link_redirects_no_write(tmp_path):
    victim = _victim(tmp_path / "victim")
    out = tmp_path / "out"
    folder = RunFolder(out).create()
    moved = _swap(out, victim)
    folder.write_meta({"mode": "run", "start_time": 1.0, "end_time": 2.0, "status": "finished"})
    rows = folder.appender("samples/host.jsonl")
    rows.write({"t": 1.5, "cpu_total_pct": 1.0})
    rows.close()
    _untouched(victim)
    launcher._report(folder, launcher.RunSpec([], summary=False))
    _untouched(victim)
    for name in ("meta.json", "samples/host.jsonl", "report.json", "report.html", "report.md"):
        assert (moved / name).is_file(), name


def test_attach_gives_her_the_real_folders_never_a_links_target(tmp_path, other_user):
    victim = _victim(tmp_path / "victim")
    (victim / "events").mkdir(mode=0o700)  # what she would like to be given
    (victim / "attach").mkdir(mode=0o700)
    out = tmp_path / "out"
    folder = RunFolder(out).create()
    (out / "attach").mkdir(mode=0o700)
    moved = _swap(out, victim)
    folder.share(other_user.uid, other_user.gid, ("attach", "events"))
    for name in ("events", "attach"):
        st = (victim / name).stat()
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700, f"{name} of the link's target given away"
        assert (moved / name).stat().st_uid == other_user.uid
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700
    assert stat.S_IMODE(moved.stat().st_mode) == 0o711


def test_a_link_in_place_of_a_subfolder_is_never_given_away(tmp_path, other_user):
    victim = _victim(tmp_path / "victim")
    folder = RunFolder(tmp_path / "out").create()
    os.rmdir(folder.at / "events")
    os.symlink(victim, folder.at / "events")
    with pytest.raises(OSError, match="symbolic link"):
        folder.share(other_user.uid, other_user.gid, ("events",))
    _untouched(victim)
