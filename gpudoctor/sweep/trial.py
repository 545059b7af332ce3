"""One trial: the replay worker in its own process, under the in-process hooks.

The worker is the same honest training script ``gpudoctor replay`` profiles; the
hooks (loaded through ``sitecustomize`` as under ``gpudoctor run``) write its
batch arrivals and data waits to the trial folder, and :mod:`windows` turns
them into steady-state figures. A trial that runs out of memory, crashes or
hangs past its timeout is classified here; the sweep goes on either way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.common.wording import plural
from gpudoctor.launch.recorder import child_env
from gpudoctor.processes import childpy
from gpudoctor.processes.pids import ExitWaiter
from gpudoctor.samplers.nvml import Nvml
from gpudoctor.samplers.tree import TreeSampler
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.windows import early_rate, read_trial, steady_state

LOG = "worker.log"
MAX_STEPS = 10**9  # the time bound stops the trial, never the step count
POLL_S = 0.5  # how often a trial that may be pruned has its windows read
OOM_MARKS = (
    "OutOfMemoryError",
    "CUDA out of memory",
    "MemoryError",
    "DefaultCPUAllocator: can't allocate memory",
)

# (whole windows measured so far, samples/s over them) -> True to stop the trial (pruned)
Watch = Callable[[int, float], bool]


@dataclass
class TrialRun:
    """What one worker process gave: a status, and figures when it trained steadily."""

    status: str  # ok | oom | crashed | timeout | no_steady_state | pruned
    reason: str | None = None
    steady: dict[str, Any] | None = None
    measure_path: Path | None = None
    peak_rss_mib: float | None = None
    peak_gpu_mem_mib: float | None = None
    gpu_busy: float | None = None
    gpu_name: str | None = None
    wall_s: float = 0.0


def command(config_yaml: Path, run_dir: Path, protocol: Protocol) -> list[str]:
    return childpy.isolated(
        "gpudoctor.replay.worker", str(config_yaml),
        "--max-steps", str(MAX_STEPS), "--max-seconds", f"{protocol.train_s:g}",
        "--measure-out", str(run_dir),
    )  # fmt: skip


def prepare(config_yaml: Path, timeout_s: float) -> TrialRun | None:
    """Build the replay's data cache (unmeasured, as ``gpudoctor replay`` does); how it failed, if it did.

    Past ``--trial-timeout`` the point is a ``timeout`` (as a trial that hangs), not a crash."""
    cmd = childpy.isolated("gpudoctor.replay.worker", str(config_yaml), "--prepare-only")
    env = childpy.doctor_env({**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return TrialRun("timeout", f"preparing the data took longer than --trial-timeout {timeout_s:g} s")
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    last = lines[-1].removeprefix("gpudoctor: ") if lines else f"exit code {proc.returncode}"
    return TrialRun("crashed", "preparing the data failed: " + last.replace(f"{config_yaml}:", "line "))


def run_trial(
    config_yaml: Path,
    run_dir: Path,
    protocol: Protocol,
    timeout_s: float,
    batch_size: int,
    nvml: Nvml | None = None,
    watch: Watch | None = None,
) -> TrialRun:
    """Run the worker once and classify how it ended; ``watch`` may stop it early (pruned)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(run_dir, childpy.doctor_env())
    env.update(GPUDOCTOR_PROFILE_WINDOW="off", TOKENIZERS_PARALLELISM="false")
    env.pop("GPUDOCTOR_HOOKS", None)  # the hooks are how a trial is measured
    if protocol.torch_threads:
        threads = str(protocol.torch_threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    start = time.perf_counter()
    with open(run_dir / LOG, "wb") as log:
        proc = subprocess.Popen(
            command(config_yaml, run_dir, protocol),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with TreeSampler(proc.pid, nvml=nvml) as monitor:
            ended = _wait(proc, timeout_s, _pruner(watch, run_dir, proc.pid, batch_size, protocol))
    if isinstance(ended, TrialRun):
        result = ended
    else:
        result = _classify(
            proc.returncode, ended, run_dir, proc.pid, protocol, batch_size, timeout_s
        )
    if result.reason:  # the trial's YAML lives in the cache: its path says nothing to the user
        result.reason = result.reason.replace(f"{config_yaml}:", "line ")
    result.wall_s = time.perf_counter() - start
    result.peak_rss_mib = round(monitor.peak_rss_mib, 1) or None
    result.peak_gpu_mem_mib = monitor.peak_gpu_mem_mib
    result.gpu_name = nvml.name(nvml.indices[0]) if nvml is not None and nvml.indices else None
    if result.steady is not None:
        t0 = result.steady["first_batch_t"] + result.steady["steady_from_s"]
        result.gpu_busy = monitor.gpu_busy(t0, t0 + result.steady["steady_s"])
    return result


def _pruner(
    watch: Watch | None, run_dir: Path, pid: int, batch_size: int, protocol: Protocol
) -> Callable[[], TrialRun | None] | None:
    """A check run every :data:`POLL_S`: each newly whole window goes to ``watch``."""
    if watch is None:
        return None
    told = 0

    def check() -> TrialRun | None:
        nonlocal told
        early = early_rate(read_trial(run_dir, pid), batch_size, protocol)
        if early is None or early[0] <= told:
            return None
        told = early[0]
        if watch(*early):
            return TrialRun(
                "pruned",
                f"stopped after {plural(told, 'window')} at {early[1]:.3g} samples/s, "
                "clearly slower than the best point so far",
            )
        return None

    return check


def _wait(
    proc: subprocess.Popen[bytes], timeout_s: float, check: Callable[[], TrialRun | None] | None
) -> bool | TrialRun:
    """Wait for the worker: True past the timeout, a pruned run when ``check`` says so.

    Either way its whole session is stopped (DataLoader workers too). The worker has its
    own session, so Ctrl-C reaches only us: stop it before leaving.
    """
    deadline = time.monotonic() + timeout_s
    exited = ExitWaiter(proc)  # asleep in the kernel, not polling beside the trial being timed
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if exited.wait(min(left, POLL_S) if check else left) is not None:
                return False
            pruned = check() if check else None
            if pruned is not None:
                _stop(proc)
                return pruned
    except KeyboardInterrupt:
        _stop(proc)
        raise
    finally:
        exited.close()
    _stop(proc)
    return True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)  # our own child's session, started just above
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _classify(
    code: int,
    timed_out: bool,
    run_dir: Path,
    pid: int,
    protocol: Protocol,
    batch_size: int,
    timeout_s: float,
) -> TrialRun:
    events = read_trial(run_dir, pid)
    if timed_out:
        got = events.batch_count
        return TrialRun(
            "timeout",
            f"still running after --trial-timeout {timeout_s:g} s ({got} batches arrived); stopped",
        )
    tail = _tail(run_dir / LOG)
    if code != 0:
        if any(mark in tail for mark in OOM_MARKS) or code in (-signal.SIGKILL, 137):
            return TrialRun("oom", _last_line(tail) or "killed (out of memory?)")
        return TrialRun("crashed", f"exit code {code}: {_last_line(tail)}")
    steady = steady_state(events, batch_size, protocol)
    if steady is None:
        got = events.batch_count
        return TrialRun(
            "no_steady_state",
            f"only {got} batches in {protocol.train_s:g} s of training: "
            "raise --warmup-s/--window-s for slow steps",
        )
    measure = run_dir / "replay_measure.json"
    return TrialRun("ok", None, steady, measure if measure.is_file() else None)


def _tail(path: Path, size: int = 8000) -> str:
    try:
        data = path.read_bytes()[-size:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")]
    last = lines[-1] if lines else ""
    return last.removeprefix("gpudoctor: ")[:300]
