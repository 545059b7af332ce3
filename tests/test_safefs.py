"""The safe-file primitives every path in a folder another user can write goes through."""

from __future__ import annotations

import os

import pytest

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError


def test_reads_refuse_links_and_fifos_and_never_block(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")  # a plain open() of a FIFO with no writer blocks forever
    with pytest.raises(safefs.UnsafeFile, match="symbolic link"):
        safefs.read_bytes(tmp_path / "link")
    with pytest.raises(safefs.UnsafeFile, match="not a regular file"):
        safefs.read_bytes(tmp_path / "fifo")
    assert safefs.read_bytes(secret) == b"root only"
    with pytest.raises(safefs.UnsafeFile, match="larger than"):
        safefs.read_bytes(secret, limit=3)


def test_writes_never_go_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "report.md").symlink_to(victim)
    with pytest.raises(FileExistsError):
        os.close(safefs.create_new(tmp_path / "report.md"))
    with pytest.raises(safefs.UnsafeFile):
        safefs.open_append(tmp_path / "report.md")
    safefs.replace_file(tmp_path / "report.md", "ours")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "report.md").is_symlink()
    assert (tmp_path / "report.md").read_text() == "ours"
    assert oct((tmp_path / "report.md").stat().st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "victim"]  # no temp file left


def test_reads_can_demand_an_owner(tmp_path, other_user):
    mine = tmp_path / "mine"
    mine.write_text("x")
    assert safefs.read_bytes(mine, owner=other_user.uid) == b"x"  # the doctor's own files always pass
    theirs = tmp_path / "theirs"
    theirs.write_text("y")
    os.chown(theirs, other_user.uid, other_user.gid)
    assert safefs.read_bytes(theirs, owner=other_user.uid) == b"y"
    os.chown(mine, 4242, 4242)
    with pytest.raises(safefs.UnsafeFile, match="owned by uid 4242"):
        safefs.read_bytes(mine, owner=other_user.uid)


def test_private_dir_refuses_what_another_user_could_have_prepared(tmp_path, other_user):
    fresh = safefs.private_dir(tmp_path / "a" / "new")
    assert fresh.stat().st_mode & 0o777 == 0o700
    assert safefs.private_dir(fresh) == fresh  # our own private folder is reused
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UserError, match="writable by other users"):
        safefs.private_dir(shared)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.uid, other_user.gid)
    with pytest.raises(UserError, match="not to you"):
        safefs.private_dir(theirs)
    (tmp_path / "link").symlink_to(fresh)
    with pytest.raises(UserError, match="not a folder"):
        safefs.private_dir(tmp_path / "link")
