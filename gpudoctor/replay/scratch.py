"""Where a replay's checkpoints go while it trains: inside its own run folder.

A replay saves real checkpoints (``torch.save``, ``Trainer``'s ``output_dir``) so the
profile sees their cost. They used to go to ``/tmp/gpudoctor-replay-*``, outside the
run folder, and a killed replay left them there. Now they go to ``<run>/scratch/``
(the run folder is the doctor's, 0700), one ``<kind>-<pid>-<random>`` folder per
use, removed on the way out; leftovers of a dead process (SIGKILL skips ``finally``)
are removed by the next user of the folder, and ``gpudoctor replay`` removes the
whole ``scratch/`` once its worker has ended, however it ended.

Without a run folder (the worker run by hand) the base is ``scratch/`` in the replay
cache (``~/.cache/gpudoctor/replay``), private like it (:func:`safefs.private_dir`):
nothing is ever written under ``/tmp``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.processes.pids import pid_alive

SCRATCH = "scratch"


def base_dir() -> Path:
    """``$GPUDOCTOR_RUN_DIR/scratch``, else the replay cache's ``scratch/``; private either way."""
    run_dir = os.environ.get("GPUDOCTOR_RUN_DIR")
    if run_dir:
        return safefs.private_dir(Path(run_dir) / SCRATCH, "the replay's scratch folder")
    from gpudoctor.replay.cache import private_root  # the config's types: only outside a run folder

    return safefs.private_dir(private_root() / SCRATCH, "the replay's scratch folder")


@contextlib.contextmanager
def scratch_dir(kind: str) -> Iterator[Path]:
    """A fresh private folder for ``kind`` (``ckpt``, ``trainer``), removed when the block ends."""
    base = base_dir()
    remove_stale(base)
    folder = base / f"{kind}-{os.getpid()}-{secrets.token_hex(4)}"
    folder.mkdir(mode=0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale(base: Path) -> int:
    """Remove the folders of processes that are gone; returns how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = _owner_pid(entry.name)
            if pid is None or not entry.is_dir(follow_symlinks=False) or pid_alive(pid):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def remove_all(run_dir: Path) -> None:
    """After the worker ended: its run folder's whole ``scratch/`` (never a link's target)."""
    path = run_dir / SCRATCH
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)


def _owner_pid(name: str) -> int | None:
    parts = name.split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return int(parts[1])
