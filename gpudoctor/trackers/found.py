"""The tracker runs a recording names: the hooks' ``tracker`` events, checked and deduplicated.

The events come from the patient's folder (``events/<pid>.jsonl``), so every field is checked
here before the doctor acts on it: a kind it knows, short strings, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.core.events import TrackerEvent
from gpudoctor.core.schema import TrackerKind

KINDS = ("mlflow", "wandb", "tensorboard")
MAX_FIELD = 4096  # a path or URI longer than this is not one the hooks wrote
FIELDS = ("run_id", "experiment_id", "tracking_uri", "artifact_uri", "cwd", "project", "entity", "mode",
          "root_dir", "sync_dir", "log_dir")


@dataclass(frozen=True)
class TrackerRun:
    """One run of one tracker, as the training process saw it."""

    kind: TrackerKind
    pid: int | None
    fields: dict[str, str]

    def get(self, key: str) -> str | None:
        return self.fields.get(key)

    @property
    def key(self) -> str:
        return self.get("log_dir") if self.kind == "tensorboard" else self.get("run_id")  # type: ignore[return-value]


def tracker_runs(events: Mapping[int, Sequence[TrackerEvent]]) -> list[TrackerRun]:
    """Each run once, in the order the training started them."""
    runs: dict[tuple[str, str], tuple[float, TrackerRun]] = {}
    for pid, evs in events.items():
        for e in evs:
            run = _run(pid, e)
            if run is not None and run.key and (run.kind, run.key) not in runs:
                t = e.get("t")
                runs[(run.kind, run.key)] = (t if isinstance(t, (int, float)) else 0.0, run)
    return [run for _, run in sorted(runs.values(), key=lambda item: item[0])]


def _run(pid: int, e: Any) -> TrackerRun | None:
    if not isinstance(e, dict) or e.get("kind") not in KINDS:  # kept as written, never checked on load
        return None
    fields = {k: e[k] for k in FIELDS if isinstance(e.get(k), str) and 0 < len(e[k]) <= MAX_FIELD
              and "\x00" not in e[k]}
    return TrackerRun(kind=e["kind"], pid=pid, fields=fields)
