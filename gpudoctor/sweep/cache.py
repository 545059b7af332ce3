"""Trial results on disk, keyed by the digest of the trial's effective config.

``<cache>/<key>/trial.json`` holds what the trial measured (not which sweep asked
for it), next to its ``config.yaml`` and each run's folder (events, worker log,
``replay_measure.json``), so a repeated or resharded sweep runs only new points.
Crashes and timeouts are not cached: they are often the machine's, not the point's.

The cache folder is private (0700, :func:`safefs.private_dir`): a record is trusted as
measured, so a folder another user made or can write is refused in one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.replay.scratch import remove_all

CACHED_STATUSES = ("ok", "oom", "no_steady_state")  # never "pruned": a partial measurement
RECORD = "trial.json"


def default_root() -> Path:
    """``$GPUDOCTOR_SWEEP_CACHE`` or ``~/.cache/gpudoctor/sweep``."""
    env = os.environ.get("GPUDOCTOR_SWEEP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpudoctor" / "sweep"


class TrialCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._private = False

    def _check(self, create: bool) -> bool:
        """True once the cache folder is known private (made 0700 when ``create``); a folder
        another user made or can write is one :class:`UserError`, before any record is trusted."""
        if not self._private:
            if not create and not os.path.lexists(self.root):
                return False  # nothing cached yet, and nothing made until a trial runs
            safefs.private_dir(self.root, "the sweep cache")
            self._private = True
        return True

    def make_root(self) -> Path:
        """The cache folder, made private if new (a study's SQLite file lives there too)."""
        self._check(create=True)
        return self.root

    def folder(self, key: str) -> Path:
        self._check(create=True)
        return self.root / key

    def load(self, key: str) -> dict[str, Any] | None:
        if not self._check(create=False):
            return None
        path = self.folder(key) / RECORD
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # missing or cut short: measure again
        return record if isinstance(record, dict) and record.get("key") == key else None

    def save(self, record: dict[str, Any]) -> None:
        """Keep a measured record (never a crash or timeout); drop every run's checkpoints."""
        folder = self.folder(record["key"])
        if folder.is_dir():
            for run_dir in folder.iterdir():  # a trial stopped at its timeout left its checkpoints
                remove_all(run_dir)
        if record["status"] not in CACHED_STATUSES:
            return
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        safefs.replace_file(folder / RECORD, json.dumps(record, indent=1))

    def measure(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The worker's ``replay_measure.json`` of the record's last good run, for preflight."""
        name = record.get("measure_file")
        if not name:
            return None
        try:
            measured: dict[str, Any] = json.loads((self.folder(record["key"]) / name).read_text())
            return measured
        except (OSError, ValueError):
            return None
