"""``--backend ray``: each trial a Ray task, as many at once as the cluster has room for.

Why Ray and not plumbing of our own: it already schedules tasks on the resources they
ask for, across machines, and tells a task that died from one that failed. A trial
asks for ``num_gpus=1`` where the cluster has GPUs (Ray then sets the task's
``CUDA_VISIBLE_DEVICES``) and one CPU for the training loop plus one per DataLoader
worker, so two trials never share what they measure. The task is the same trial as
the local backend's (:func:`gpudoctor.sweep.trial.run_trial`, the replay worker under
the hooks, in a scratch folder on its node); what comes back to the driver is the
:class:`TrialRun`, the worker's ``replay_measure.json`` and the tail of its log, which
the driver writes into its own cache. The nodes need gpudoctor installed (the same
version as the driver): the task imports this module by name.

Without ``--ray-address`` a local Ray instance is started for the sweep and stopped
after it; with ``auto`` or ``HOST:PORT`` the driver joins a running cluster.

What a local instance opens (SECURITY.md says it too): Ray's GCS, raylet, workers and the
driver (this process) listen on TCP ports of every interface, which Ray 2.x cannot be told to
bind to loopback (``_node_ip_address=127.0.0.1`` is turned into the node's address). So the
instance requires Ray's token authentication, with a fresh random token that lives only in the
environment of this process and its Ray children (never ``~/.ray/auth_token``), unless
``RAY_AUTH_MODE`` is set already; the dashboard is off, and what would listen on a host of our
choosing is given ``127.0.0.1``. Only Ray 2.52 and later read ``RAY_AUTH_MODE``: on an older Ray
those ports take any client (one joined a 2.51.1 instance and ran a task as root, issue #34), so a
local instance is refused there, before Ray is imported, and the ``[ray]`` extra asks for 2.52.
Ray's files (session, logs, sockets; Ray makes them 0777) go to
``ray-<pid>/`` in the doctor's private state folder (0700, :func:`gpudoctor.attach.scratch.state_dir`),
never ``/tmp/ray``, and are removed when the sweep ends. ``ray.init`` runs from that folder, as Ray
puts the driver's current folder on its workers' ``sys.path``: a ``gpudoctor/`` planted in the
folder the sweep was started from is never imported by a trial.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from importlib import metadata
from pathlib import Path
from typing import Any

from gpudoctor.attach.scratch import state_dir
from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.samplers.tree import open_nvml
from gpudoctor.sweep.backend import TrialJob
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.results import available_cores
from gpudoctor.sweep.trial import LOG, TrialRun, prepare, run_trial

LOCAL_OBJECT_STORE_BYTES = 100 * 2**20  # trials return a few kB: keep a local instance small
LOOPBACK = "127.0.0.1"
LOG_TAIL_BYTES = 16_000
MEASURE = "replay_measure.json"
TOKEN_AUTH_SINCE = (2, 52)  # the first Ray whose GCS and raylet check RAY_AUTH_MODE=token


def _import_ray() -> Any:
    try:
        import ray  # optional: pip install 'gpudoctor[ray]'
    except ImportError:
        raise UserError(
            "--backend ray needs ray: pip install 'gpudoctor[ray]' (or drop --backend ray)"
        ) from None
    return ray


def ray_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """The Ray task: prepare and run one trial in a scratch folder of its node; plain data back."""
    # In the node's private state folder (0700), not /tmp: a fresh name, made O_EXCL by mkdtemp
    scratch = Path(tempfile.mkdtemp(prefix="trial-", dir=state_dir()))
    try:
        config_yaml = scratch / "config.yaml"
        config_yaml.write_text(payload["yaml_text"], encoding="utf-8")
        protocol = Protocol(**payload["protocol"])
        failed = prepare(config_yaml, payload["timeout_s"])
        if failed:
            return {"run": failed.__dict__, "measure": None, "log": ""}
        run_dir = scratch / "run"
        run = run_trial(
            config_yaml,
            run_dir,
            protocol,
            payload["timeout_s"],
            payload["batch_size"],
            open_nvml(),
        )
        measure = run.measure_path.read_text() if run.measure_path else None
        log = (run_dir / LOG).read_bytes()[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")
        run.measure_path = None  # a path on the node means nothing to the driver
        return {"run": run.__dict__, "measure": measure, "log": log}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # checkpoints, prepared copies


class RayBackend:
    """Trials as Ray tasks; results handed back in the order they finish."""

    name = "ray"

    def __init__(self, address: str | None) -> None:
        if not address:  # before Ray is imported: its token loader reads the environment once
            require_token_auth(installed_ray_version())
            token_auth(os.environ)
        self.ray = ray = _import_ray()
        if not address:
            _reload_auth()
        self._private = private_folder()
        kwargs = init_kwargs(address, self._private)
        try:
            with inside(self._private):  # Ray adds the driver's current folder to its workers' sys.path
                ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            shutil.rmtree(self._private, ignore_errors=True)
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(
                f"--backend ray: cannot reach {where} ({first[:160]}); start one with "
                "`ray start --head` or pass its --ray-address"
            ) from None
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.cores = int(max((n.get("CPU", 0) for n in nodes), default=0)) or 1
        self.gpu = any(n.get("GPU", 0) >= 1 for n in nodes)
        self.slots = max(1, int(sum(n.get("CPU", 0) for n in nodes)))
        self.on_start: Callable[[TrialJob], None] | None = None
        self._task = ray.remote(ray_trial)
        self._refs: dict[Any, TrialJob] = {}

    def submit(self, job: TrialJob) -> None:
        payload = {
            "yaml_text": job.yaml_text,
            "protocol": job.protocol.as_dict(),
            "timeout_s": job.timeout_s,
            "batch_size": job.batch_size,
        }
        ref = self._task.options(
            num_cpus=min(1 + job.workers, self.cores),
            num_gpus=1 if self.gpu else 0,
            max_retries=0,  # a crash is a result to record, not something to hide by retrying
            name=f"gpudoctor trial {job.label}",
        ).remote(payload)
        self._refs[ref] = job
        if self.on_start is not None:
            self.on_start(job)

    def pending(self) -> int:
        return len(self._refs)

    def next_done(self) -> tuple[TrialJob, TrialRun]:
        ready, _ = self.ray.wait(list(self._refs), num_returns=1)
        job = self._refs.pop(ready[0])
        try:
            out = self.ray.get(ready[0])
        except self.ray.exceptions.RayError as exc:  # the task or its worker died
            return job, TrialRun("crashed", f"the Ray task failed: {_one_line(exc)}")
        return job, _land(job, out)

    def close(self) -> None:
        for ref in list(self._refs):
            self.ray.cancel(ref, force=True)
        self._refs.clear()
        self.ray.shutdown()
        shutil.rmtree(self._private, ignore_errors=True)


def private_folder() -> Path:
    """``ray-<pid>/`` in the doctor's private state folder: 0700, the doctor's user's alone."""
    return safefs.private_dir(state_dir() / f"ray-{os.getpid()}", "the Ray folder")


def init_kwargs(address: str | None, private: Path) -> dict[str, Any]:
    """``ray.init``'s arguments: join ``address``, else a small local instance kept in ``private``."""
    kwargs: dict[str, Any] = {
        "log_to_driver": False,  # the trials' output is in each run's worker.log
        "logging_level": "ERROR",
        "include_dashboard": False,
        "dashboard_host": LOOPBACK,
    }
    if address:
        kwargs["address"] = address
    else:  # a local instance for this sweep only; Ray makes its temp root 0777: one level below ours
        kwargs.update(num_cpus=available_cores(), object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                      _temp_dir=str(private / "r"))
    return kwargs


def installed_ray_version() -> str:
    """The installed Ray's version, read from its metadata (importing Ray would read the environment)."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        _import_ray()  # says how to install it
        raise


def require_token_auth(version: str) -> None:
    """Refuse a Ray that would run a local instance with its ports open to anyone (< 2.52)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) >= TOKEN_AUTH_SINCE:
        return
    since = ".".join(map(str, TOKEN_AUTH_SINCE))
    raise UserError(
        f"--backend ray: Ray {version[:40]!r} does not enforce token authentication (Ray >= {since} "
        f"does) and a local instance listens on every interface; pip install 'ray>={since}' "
        "(or join a cluster you secured with --ray-address)"
    )


def token_auth(env: MutableMapping[str, str]) -> None:
    """Ray's token authentication on, with a fresh token kept in the environment only; a
    ``RAY_AUTH_MODE`` the user set is theirs to keep."""
    if "RAY_AUTH_MODE" not in env:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def _reload_auth() -> None:
    """Ray imported earlier in this process (a test) has read its auth settings: read them again."""
    with contextlib.suppress(Exception):  # private API of Ray's: absent in another version, nothing to do
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run the block with ``folder`` as the current folder, then come back (by descriptor)."""
    back = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(folder)
        yield
    finally:
        os.fchdir(back)
        os.close(back)


def _land(job: TrialJob, out: dict[str, Any]) -> TrialRun:
    """Write what came back into the driver's run folder, as a local trial would have left it."""
    run = TrialRun(**out["run"])
    job.run_dir.mkdir(parents=True, exist_ok=True)
    (job.run_dir / LOG).write_text(out.get("log") or "", encoding="utf-8")
    if out.get("measure"):
        path = job.run_dir / MEASURE
        path.write_text(out["measure"], encoding="utf-8")
        run.measure_path = path
    return run


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if not ln.startswith(("File ", "^"))), "")
    return (last or type(exc).__name__)[:300]

