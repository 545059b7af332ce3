"""MLflow: the figures, the findings table and report.html, added to the training's own run.

Through ``MlflowClient(tracking_uri)`` on the recorded run id, so it works after the training
ended the run (HF's callback ends it at train end). Local stores only (a ``file:`` folder or a
``sqlite:`` database on this machine): a tracking server is a network call, which the doctor
never makes. In the doctor's process MLflow's usage telemetry is turned off before MLflow is
imported; inside the training (the in-process API) MLflow is the user's, as they configured it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from gpudoctor.trackers import folders
from gpudoctor.trackers.figures import COLUMNS, Figures
from gpudoctor.trackers.found import TrackerRun
from gpudoctor.trackers.outcome import Outcome

ARTIFACT_DIR = "gpudoctor"
SERVER_NAMES = ("databricks", "databricks-uc", "uc")  # scheme-less URIs MLflow reads as servers, not paths


def add(run: TrackerRun, figures: Figures, html: Path) -> Outcome:
    run_id = run.get("run_id") or ""
    target = f"MLflow run {run_id}"
    store = local_store(run.get("tracking_uri"), run.get("cwd"))
    if isinstance(store, str):
        return Outcome.skipped(target, store)
    uri, root, db = store
    target = f"MLflow run {run_id} ({uri})"
    experiment = run.get("experiment_id") or ""
    why = (folders.regular_file_problem(db) or folders.problem(root)) if db else folders.problem(root, (experiment, run_id))
    if why:
        return Outcome.skipped(target, why)
    artifacts = local_path(run.get("artifact_uri"), run.get("cwd"))
    art_why = "the run's artifact store is not a folder on this machine" if artifacts is None else \
        folders.problem(_existing(artifacts), ())
    if "mlflow" not in sys.modules:  # the doctor's own process: no usage telemetry from us
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    if db is None:  # MLflow 3 refuses its file store unless opted in: the training did, to use it
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow.entities import Metric, RunTag
        from mlflow.tracking import MlflowClient
    except ImportError:
        return Outcome.skipped(target, "mlflow is not installed where the doctor runs (pip install mlflow-skinny)")
    client = MlflowClient(tracking_uri=uri)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, figures.step) for k, v in figures.metrics.items()],
                     tags=[RunTag("gpudoctor.verdict", figures.verdict[:5000])])
    parts = [f"{len(figures.metrics)} metrics"]
    if art_why is None:
        _log_table(client, run_id, figures)
        client.log_artifact(run_id, str(html), artifact_path=ARTIFACT_DIR)
        parts += [f"{ARTIFACT_DIR}/findings.json", f"{ARTIFACT_DIR}/report.html"]
    else:
        parts.append(f"no artifacts ({art_why})")
    return Outcome.added(target, ", ".join(parts))


def _log_table(client: Any, run_id: str, figures: Figures) -> None:
    """``log_table`` (MLflow's table view) needs pandas; without it the same rows as JSON."""
    data = {c: [row[i] for row in figures.rows] for i, c in enumerate(COLUMNS)}
    try:
        import pandas  # noqa: F401  (only to know whether log_table can run)
    except ImportError:
        client.log_dict(run_id, {"columns": list(COLUMNS), "data": figures.rows}, f"{ARTIFACT_DIR}/findings.json")
        return
    client.log_table(run_id, data=data, artifact_file=f"{ARTIFACT_DIR}/findings.json")


def local_store(uri: str | None, cwd: str | None) -> tuple[str, str, str | None] | str:
    """``(uri, folder, sqlite file or None)`` of a store on this machine, or why it is not one."""
    if not uri:
        return "the training's tracking URI was not recorded"
    if uri.startswith("sqlite:///"):
        rest = uri[len("sqlite:///"):].split("?")[0]
        db = os.path.normpath(rest if rest.startswith("/") else os.path.join(cwd or "", rest))  # links: folders.py
        return f"sqlite:///{db}", os.path.dirname(db), db
    path = None if uri.split(":", 1)[0] in SERVER_NAMES else local_path(uri, cwd)
    if path is None:
        scheme = uri.split(":", 1)[0]
        return (f"the tracking store is a server ({scheme}:), and gpudoctor makes no network call; "
                "use a local store (file: or sqlite:) to get its figures there")
    return f"file://{path}", path, None


def local_path(uri: str | None, cwd: str | None) -> str | None:
    """The folder a ``file:`` URI or a plain path names (relative ones against the training's cwd)."""
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        path = unquote(parsed.path)
    elif parsed.scheme == "":
        path = uri
    else:
        return None
    # Not resolved here: a link is followed only by folders.open_checked, when nobody else could plant it.
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(cwd or "/", path))


def _existing(path: str) -> str:
    """The nearest folder of ``path`` that exists (MLflow creates the rest, as the doctor's user)."""
    p = Path(path)
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return str(p)
