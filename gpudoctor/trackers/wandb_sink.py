"""W&B: the figures in the run's summary, the findings as a table, report.html as an artifact.

Two ways, and only these: inside the training (``gpudoctor.profile()``, the callbacks) the live
``wandb.run`` is the user's own run object, so the figures go where that run sends everything
else, as the user configured it (online or offline). From the doctor's process after the training
has ended, only an **offline** run can be added to: the doctor resumes it offline (same id, same
folder), which writes a second offline run folder that ``wandb sync`` uploads with the first. An
online run is left alone: adding to it from outside is a network call, which the doctor never
makes. The doctor's wandb is started offline with no git, code, console or system-stats capture
and no error reporting.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gpudoctor.trackers import folders
from gpudoctor.trackers.figures import COLUMNS, PREFIX, Figures
from gpudoctor.trackers.found import TrackerRun
from gpudoctor.trackers.outcome import Outcome


def add(run: TrackerRun, figures: Figures, html: Path) -> Outcome:
    run_id = run.get("run_id") or ""
    target = f"W&B run {run.get('project') or '?'}/{run_id}"
    live = _live_run(run_id)
    if live is not None:
        _log(sys.modules["wandb"], live, figures, html)
        return Outcome.added(target, f"{_what(figures)}, in the live run ({run.get('mode') or 'online'})")
    if run.get("mode") != "offline":
        return Outcome.skipped(target, "an online run that has ended: adding to it would be a network call, "
                                       "which gpudoctor never makes; use gpudoctor.profile() or the callback "
                                       "(they add to the live run) or WANDB_MODE=offline")
    root = os.path.normpath(run.get("root_dir") or "/")  # links: only those folders.problem trusts
    why = folders.problem(root, ("wandb",)) if run.get("root_dir") else "the run's folder was not recorded"
    if why:
        return Outcome.skipped(target, why)
    if "wandb" not in sys.modules:  # the doctor's own process: no error reports from us
        os.environ["WANDB_ERROR_REPORTING"] = "false"
    try:
        import wandb
    except ImportError:
        return Outcome.skipped(target, "wandb is not installed where the doctor runs (pip install wandb)")
    resumed = wandb.init(
        id=run_id, project=run.get("project"), entity=run.get("entity"), dir=root, mode="offline",
        resume="allow", settings=wandb.Settings(console="off", disable_git=True, save_code=False,
                                                x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                                                x_save_requirements=False, silent=True))
    try:
        _log(wandb, resumed, figures, html)
        where = resumed.settings.sync_dir
    finally:
        resumed.finish()
    return Outcome.added(target, f"{_what(figures)}, as a resumed offline run in {where} "
                                 "(wandb sync uploads it with the training's)")


def _live_run(run_id: str) -> Any:
    wandb = sys.modules.get("wandb")
    live = getattr(wandb, "run", None) if wandb is not None else None
    return live if live is not None and getattr(live, "id", None) == run_id else None


def _log(wandb: Any, run: Any, figures: Figures, html: Path) -> None:
    run.summary.update(figures.metrics)
    run.summary[f"{PREFIX}/verdict"] = figures.verdict
    run.log({f"{PREFIX}/findings": wandb.Table(columns=list(COLUMNS), data=figures.rows)})
    artifact = wandb.Artifact(f"gpudoctor-report-{run.id}", type="gpudoctor-report")
    artifact.add_file(str(html), name="report.html")
    run.log_artifact(artifact)


def _what(figures: Figures) -> str:
    return f"{len(figures.metrics)} summary figures, {PREFIX}/findings table, report.html artifact"
