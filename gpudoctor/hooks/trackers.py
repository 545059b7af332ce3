"""Which experiment-tracker runs the training logs to, so the doctor can add its figures to them.

One ``tracker`` event per run the process starts or has live when the hooks go in: MLflow
(``MlflowClient.create_run``, which the fluent ``mlflow.start_run``, HF's ``report_to="mlflow"``
and Lightning's ``MLFlowLogger`` all go through, plus ``mlflow.start_run`` of an existing run),
W&B (``wandb.init``, or a live ``wandb.run`` under ``attach``) and TensorBoard (each
``torch.utils.tensorboard.SummaryWriter``'s log dir, as HF's ``report_to="tensorboard"`` makes).
The event locates the run and nothing more: kind, ids, project, folders, whether W&B is offline,
and the tracking URI redacted (a URI may carry a password). Never a key, never the environment.

Nothing in the tracker is set up, called or changed but these wraps; every body of ours is
guarded (:mod:`gpudoctor.hooks.guard`), so a tracker we misread never reaches the training.
Stdlib-only, like the rest of the injected part.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType
from typing import Any, cast

from gpudoctor.common.redact import redact_value
from gpudoctor.core.events import TrackerEvent
from gpudoctor.hooks import imports, patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.torch_hooks import safe_attr
from gpudoctor.hooks.writer import EventWriter

_writer: EventWriter | None = None
_seen: set[tuple[str, str]] = set()


def install(writer: EventWriter) -> None:
    """Watch for tracker runs from now on (and note the ones already live, for ``attach``)."""
    global _writer
    _writer = writer
    _seen.clear()
    imports.when_imported("mlflow", _install_mlflow)
    imports.when_imported("wandb", _install_wandb)
    imports.when_imported("torch.utils.tensorboard.writer", _install_tensorboard)


def _emit(kind: str, key: str, fields: dict[str, Any]) -> None:
    w = _writer
    if w is None or (kind, key) in _seen:
        return
    _seen.add((kind, key))
    clean = {k: redact_value(v) if isinstance(v, str) else v for k, v in fields.items()}
    w.emit(cast(TrackerEvent, {"k": "tracker", "t": time.time(), "kind": kind, "pid": os.getpid(), **clean}))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- MLflow ----------------------------------------------------------------------------
def _install_mlflow(mod: ModuleType) -> None:
    client = getattr(mod, "MlflowClient", None)
    if client is not None:
        patch.replace(client, "create_run", _wrap_create_run)
    patch.replace(mod, "start_run", _wrap_start_run)
    _note_active_mlflow(mod)


def _wrap_create_run(fn: Any) -> Any:
    def create_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            run = fn(self, *args, **kwargs)  # the user's call, outside any guard
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _note_mlflow(run, _client_uri(self))
        return run

    return create_run


def _wrap_start_run(fn: Any) -> Any:
    def start_run(*args: Any, **kwargs: Any) -> Any:
        try:
            run = fn(*args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _note_mlflow(run, None)
        return run

    return start_run


@guarded("tracker discovery")
def _client_uri(client: Any) -> str | None:
    return _text(safe_attr(safe_attr(client, "_tracking_client"), "tracking_uri"))


@guarded("tracker discovery")
def _note_active_mlflow(mod: ModuleType) -> None:
    run = mod.active_run()
    if run is not None:
        _note_mlflow(run, None)


@guarded("tracker discovery")
def _note_mlflow(run: Any, uri: str | None) -> None:
    info = safe_attr(run, "info")
    run_id = _text(safe_attr(info, "run_id"))
    if run_id is None:
        return
    if uri is None:
        mlflow = sys.modules.get("mlflow")
        uri = _text(mlflow.get_tracking_uri()) if mlflow is not None else None
    _emit("mlflow", run_id, {"run_id": run_id, "experiment_id": _text(safe_attr(info, "experiment_id")),
                             "tracking_uri": uri, "artifact_uri": _text(safe_attr(info, "artifact_uri")),
                             "cwd": os.getcwd()})


# -- W&B -------------------------------------------------------------------------------
def _install_wandb(mod: ModuleType) -> None:
    patch.replace(mod, "init", _wrap_wandb_init)
    _note_wandb(safe_attr(mod, "run"))


def _wrap_wandb_init(fn: Any) -> Any:
    def init(*args: Any, **kwargs: Any) -> Any:
        try:
            run = fn(*args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _note_wandb(run)
        return run

    return init


@guarded("tracker discovery")
def _note_wandb(run: Any) -> None:
    run_id = _text(safe_attr(run, "id"))
    if run_id is None:
        return
    settings = safe_attr(run, "settings")
    _emit("wandb", run_id, {"run_id": run_id, "project": _text(safe_attr(run, "project")),
                            "entity": _text(safe_attr(run, "entity")), "mode": _text(safe_attr(settings, "mode")),
                            "root_dir": _text(safe_attr(settings, "root_dir")),
                            "sync_dir": _text(safe_attr(settings, "sync_dir"))})


# -- TensorBoard -----------------------------------------------------------------------
def _install_tensorboard(mod: ModuleType) -> None:
    writer = getattr(mod, "SummaryWriter", None)
    if writer is not None:
        patch.replace(writer, "__init__", _wrap_summary_writer)


def _wrap_summary_writer(fn: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(self, *args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise
        _note_tensorboard(self)

    return __init__


@guarded("tracker discovery")
def _note_tensorboard(writer: Any) -> None:
    log_dir = _text(safe_attr(writer, "log_dir"))
    if log_dir is None:
        return
    if "://" not in log_dir:
        log_dir = os.path.abspath(log_dir)
    _emit("tensorboard", log_dir, {"log_dir": log_dir})
