"""Add the doctor's figures to the experiment-tracker runs the training already logs to.

The in-process hooks record which runs the training started (:mod:`gpudoctor.hooks.trackers`);
once the report is built, :func:`add_to_trackers` adds to each of them, through the tracker's
own API, the breakdown shares, wasted fraction, $/hour, the top findings as a table and
report.html (``docs/trackers.md``). Optional in every way: only for a tracker the training
used and the doctor's Python can import, no network call of ours, no tracker set up that the
user did not. A tracker that cannot be added to is one line saying why; a tracker that fails
never fails the report.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.common.redact import redact_value
from gpudoctor.common.termtext import say
from gpudoctor.core.events import TrackerEvent
from gpudoctor.trackers import mlflow_sink, tensorboard_sink, wandb_sink
from gpudoctor.trackers.figures import Figures

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report, TrackerEntry
from gpudoctor.trackers.found import TrackerRun, tracker_runs
from gpudoctor.trackers.outcome import Outcome

SINKS: dict[str, Callable[[TrackerRun, Figures, Path], Outcome]] = {
    "mlflow": mlflow_sink.add,
    "wandb": wandb_sink.add,
    "tensorboard": tensorboard_sink.add,
}
NAMES = {"mlflow": "MLflow", "wandb": "W&B", "tensorboard": "TensorBoard"}


def add_to_trackers(report: Report, folder: Path, events: Mapping[int, Sequence[TrackerEvent]],
                    owners: dict[int, int] | None = None) -> bool:
    """Add to each tracker run the recording names; the report gains ``trackers`` and a note per
    run. Returns whether there was any (the caller then writes the report again).

    ``owners``: pid -> uid owning that pid's events file (:attr:`Recording.event_owners`). A run
    named in a file of another user (the patient of a root ``attach``) is skipped with the reason:
    its tracker store is that user's choice, and the doctor writes nothing where another user
    pointed it. None: every event is the doctor's user's own (a caller that built them itself).
    """
    runs = tracker_runs(events)
    if not runs:
        return False
    figures = Figures.of(report)
    html = Path(folder) / "report.html"
    entries: list[TrackerEntry] = []
    for run in runs:
        outcome = _foreign(run, owners) or _add(run, figures, html)
        entries.append({"kind": run.kind, "status": outcome.status, "target": outcome.target,
                        "detail": outcome.detail})
        line = note(entries[-1])
        report.setdefault("notes", []).append(line)
        say(f"gpudoctor: {line}", file=sys.stderr)
    report["trackers"] = entries
    return True


def _foreign(run: TrackerRun, owners: dict[int, int] | None) -> Outcome | None:
    """Skipped when another user's process named this run: the doctor must not write where a less
    privileged user chose (``sqlite:////root/x.db``, a W&B ``root_dir`` in ``/etc``)."""
    me = os.geteuid()
    owner = None if owners is None else owners.get(run.pid if run.pid is not None else -1, -1)
    if owner is None or owner == me:
        return None
    who = f"uid {owner}" if owner >= 0 else "an unknown user"
    return Outcome.skipped(f"{NAMES[run.kind]} run {run.key}",
                           f"named by a process of {who}, not of the doctor's user (uid {me}): the doctor writes "
                           "nothing into a tracker store another user chose; add the figures from inside the "
                           "training (gpudoctor.profile() / the callback) or run the doctor as that user")


def _add(run: TrackerRun, figures: Figures, html: Path) -> Outcome:
    target = f"{NAMES[run.kind]} run {run.key}"
    try:
        return SINKS[run.kind](run, figures, html)
    except Exception as exc:  # the tracker's own error (a locked store, a full disk): said, never fatal
        text = redact_value(" ".join(str(exc).split()))[:300]
        return Outcome("failed", target, f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def note(entry: TrackerEntry) -> str:
    """One line for the report's notes and the terminal."""
    verb = {"added": "figures added to", "skipped": "figures not added to", "failed": "adding figures failed for"}
    return f"{verb.get(entry['status'], entry['status'])} {entry['target']}: {entry['detail']}"
