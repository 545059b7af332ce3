"""The attach payload installs whatever state it meets the patient in (issue #35's CI: an attach that
landed inside a tokenizer's ``__init__`` failed with "TokenizersBackend has no attribute verbose", and
the run had host figures only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, cli_env


def test_objects_met_half_built_are_skipped_and_the_hooks_go_in(tmp_path: Path) -> None:
    run_dir, control = tmp_path / "run", tmp_path / "control"
    run_dir.mkdir()
    control.mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "half_built_attach.py"), str(run_dir),
                           str(control)], capture_output=True, text=True, timeout=120, env=cli_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name.split(".", 1)[1] for name in seen["status"]] == ["installed.json"]
    assert seen["pad_token_id"] == 0  # read from the built tokenizer, the half-built one passed over
    loaders = [e for f in (run_dir / "events").glob("*.jsonl") for line in f.read_text().splitlines()
               if (e := json.loads(line)).get("k") == "loader"]
    assert len(loaders) == 1 and loaders[0]["batch_size"] == 4  # the built DataLoader, caught up


def _in_acquire(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "bootstrap_in_acquire.py"), *args],
                          capture_output=True, text=True, timeout=120, env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert seen["fired"] and seen["import"] == "imported", seen  # the training's own import finished
    return seen


def test_a_bootstrap_landing_inside_an_import_lock_leaves_the_import_whole_and_attaches_after(tmp_path: Path) -> None:
    """CI saw a probe die of ``KeyError`` in ``_ModuleLock.acquire`` (lazy ``import torch._dynamo`` at its
    optimizer) when the pending call landed there and the bootstrap imported the payload inside it."""
    from gpudoctor.attach.inject import write_bootstrap

    control = tmp_path / "control"
    bootstrap = write_bootstrap(control, tmp_path / "run")
    try:
        seen = _in_acquire("bootstrap", str(bootstrap), str(control))
        assert seen["done"]["ok"] is True and seen["done"]["underway"] is False  # and the attach came after
    finally:
        (control / "detach").touch()


def test_a_detach_or_install_queued_inside_an_import_lock_runs_after_the_import() -> None:
    """The payload's own pending calls (the detach, a deferred install) wait for the import as well."""
    assert _in_acquire("pending")["done"] == {"ran_after_the_import": True}
