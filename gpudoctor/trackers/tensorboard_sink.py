"""TensorBoard: the figures as scalars and the findings as a text table, in the training's log dir.

A new events file beside the training's (TensorBoard reads every events file of a run's folder),
written by torch's ``SummaryWriter`` at the run's last step. TensorBoard has no artifacts: the
text says where report.html is. Local log dirs only (``gs://``, ``s3://`` would be network).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpudoctor.common.safefs import fd_path
from gpudoctor.trackers import folders
from gpudoctor.trackers.figures import PREFIX, Figures
from gpudoctor.trackers.found import TrackerRun
from gpudoctor.trackers.outcome import Outcome


def add(run: TrackerRun, figures: Figures, html: Path) -> Outcome:
    log_dir = run.get("log_dir") or ""
    target = f"TensorBoard log dir {log_dir}"
    if "://" in log_dir:
        return Outcome.skipped(target, "a remote log dir, and gpudoctor makes no network call")
    path = log_dir if os.path.isabs(log_dir) else os.path.join(run.get("cwd") or "/", log_dir)
    checked = folders.open_checked(os.path.normpath(path))  # never resolved first: see folders.py
    if isinstance(checked, str):
        return Outcome.skipped(target, checked)
    fd, _ = checked
    try:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return Outcome.skipped(target, "tensorboard is not installed where the doctor runs "
                                           "(pip install tensorboard)")
        writer = SummaryWriter(log_dir=str(fd_path(fd)))  # the folder checked, whatever is renamed since
        try:
            for name, value in figures.metrics.items():
                writer.add_scalar(name, value, figures.step)
            writer.add_text(f"{PREFIX}/findings", figures.markdown(), figures.step)
            writer.add_text(f"{PREFIX}/report", f"report: `{html}`", figures.step)
        finally:
            writer.close()
    finally:
        os.close(fd)
    return Outcome.added(target, f"{len(figures.metrics)} scalars at step {figures.step}, "
                                 f"{PREFIX}/findings and {PREFIX}/report as text")
