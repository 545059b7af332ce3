"""A config replayed again starts no preparing worker: its prepared folder is found by a file lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.commands.replay import prepare_first
from gpudoctor.processes import childpy
from gpudoctor.replay.cache import prepared
from gpudoctor.replay.config import load_config
from tests.test_replay_worker import scaled_config


def test_the_second_replay_of_a_config_finds_its_prepared_folder_without_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_REPLAY_CACHE", str(tmp_path / "cache"))
    path = scaled_config("healthy", tmp_path)
    config = load_config(path)
    worker = childpy.isolated("gpudoctor.replay.worker", str(path))
    assert prepared(config) is None
    assert prepare_first(worker, config) is True  # a real worker built it
    folder = prepared(config)
    assert folder is not None and folder.parent == tmp_path / "cache"
    assert (folder / "meta.json").is_file() and len(list(folder.iterdir())) > 1
    assert prepare_first(worker, config) is False  # found: no worker this time
    # What the worker itself finds there is the same folder, a cache hit.
    from gpudoctor.replay.prepare import prepare

    got, meta = prepare(config)
    assert got == folder and meta["cache_hit"] is True
