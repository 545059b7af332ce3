"""Trial results on disk, keyed by the digest of the trial's effective config.

``<cache>/<key>/trial.json`` holds what the trial measured (not which sweep asked
for it), next to its ``config.yaml`` and each run's folder (events, worker log,
``replay_measure.json``), so a repeated or resharded sweep runs only new points.
Crashes and timeouts are not cached: they are often the machine's, not the point's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CACHED_STATUSES = ("ok", "oom", "no_steady_state")
RECORD = "trial.json"


def default_root() -> Path:
    """``$GPUDOCTOR_SWEEP_CACHE`` or ``~/.cache/gpudoctor/sweep``."""
    env = os.environ.get("GPUDOCTOR_SWEEP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpudoctor" / "sweep"


class TrialCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.folder(key) / RECORD
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # missing or cut short: measure again
        return record if isinstance(record, dict) and record.get("key") == key else None

    def save(self, record: dict[str, Any]) -> None:
        if record["status"] not in CACHED_STATUSES:
            return
        path = self.folder(record["key"]) / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)

    def measure(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The worker's ``replay_measure.json`` of the record's last good run, for preflight."""
        name = record.get("measure_file")
        if not name:
            return None
        try:
            return json.loads((self.folder(record["key"]) / name).read_text())
        except (OSError, ValueError):
            return None
