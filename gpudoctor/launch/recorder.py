"""The doctor's side of a recording: samplers plus meta.json, for any source.

``run`` points it at a child process, the in-process API at its own pid,
``attach`` at a live pid. It owns the run folder's meta.json: written as
``running`` at start (so a killed doctor still leaves a loadable folder) and
finalized at stop.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor._version import __version__
from gpudoctor.common.redact import redact_argv
from gpudoctor.recording.claim import unique_folder
from gpudoctor.recording.store import RunFolder
from gpudoctor.samplers.host import HostSampler
from gpudoctor.samplers.nvml import GpuSampler, Nvml
from gpudoctor.samplers.pace import Pace, StepClock

INJECT_DIR = Path(__file__).resolve().parent.parent / "_inject"
PKG_PARENT = Path(__file__).resolve().parent.parent.parent


def child_env(run_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes every Python process of a child load the hooks into ``run_dir``."""
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + old if old else "")
    env["GPUDOCTOR_RUN_DIR"] = str(run_dir.resolve())
    env["GPUDOCTOR_PKG_PARENT"] = str(PKG_PARENT)
    return env


@dataclass
class RecorderOptions:
    mode: str = "run"
    command: list[str] = field(default_factory=list)
    interval_s: float = 0.1
    price_per_gpu_hour: float | None = None
    price_source: str | None = None  # where that price came from, when not --price-per-gpu-hour
    gpus: int | None = None
    nvml_binding: Any = None  # tests inject a fake pynvml here
    adaptive: bool = True  # sampler intervals follow the step time (samplers.pace)
    doctor_priority: dict[str, str] | None = None  # what gpudoctor.processes.priority gave the doctor, for meta.json
    events_owner: int | None = None  # the uid that writes events/ (attach beside another user)


class Recorder:
    def __init__(self, folder: RunFolder, options: RecorderOptions) -> None:
        self.folder = folder
        self.options = options
        self.meta: dict[str, Any] = {}
        self._host: HostSampler | None = None
        self._gpu: GpuSampler | None = None
        self._gpus_desc: list[dict[str, Any]] = []
        self._problems: list[str] = []
        self._nvml: Any = None
        self.write_error: OSError | None = None  # the run folder could not be written (disk full...)

    def prepare(self) -> None:
        """Open NVML before the patient starts, so its first second is sampled too."""
        nvml = Nvml(binding=self.options.nvml_binding)
        if nvml.init():
            self._nvml = nvml
            self._gpus_desc = nvml.describe_gpus()
        self._problems = list(nvml.problems())

    def start(self, pid: int, start_time: float | None = None, start_note: str | None = None) -> None:
        start_time = start_time or time.time()
        self.meta = {
            "mode": self.options.mode,
            "command": redact_argv(self.options.command),
            "pid": pid,
            "started_at": dt.datetime.fromtimestamp(start_time, dt.timezone.utc).isoformat(),
            "start_time": start_time,
            "end_time": None,
            "status": "running",
            "exit_code": None,
            "host": host_info(),
            "gpus": self._gpus_desc,
            "nvml_problems": self._problems,
            "price_per_gpu_hour": self.options.price_per_gpu_hour,
            "price_source": self.options.price_source,
            "gpus_option": self.options.gpus,
            "gpudoctor_version": __version__,
            "clock": [_reading()],  # the wall and monotonic clocks now: a step found without any sample row
        }
        if self.options.doctor_priority is not None:
            self.meta["doctor_priority"] = self.options.doctor_priority
        if start_note:
            self.meta["start_note"] = start_note
        try:
            self.folder.write_meta(self.meta)
        except OSError as exc:  # --out full already: keep going (the patient is running), report at stop
            self.write_error = exc
        interval = self.options.interval_s
        self._host = HostSampler(pid, self.folder.appender("samples/host.jsonl"), interval_s=interval)
        self._host.start()
        if self._nvml is not None:
            self._gpu = GpuSampler(
                self._nvml, self.folder.appender("samples/gpu.jsonl"), interval_s=interval, pids_provider=self._host.pids
            )
            self._gpu.start()
        if self.options.adaptive:
            clock = StepClock(self.folder.events_dir, self.options.events_owner)
            for sampler in (self._host, self._gpu):
                if sampler is not None:
                    sampler.pace = Pace(interval, clock)

    def sampler_cpu_s(self) -> float:
        """CPU seconds of the sampler threads (known once stopped)."""
        return sum(s.cpu_s for s in (self._host, self._gpu) if s is not None)

    def stop(self, status: str, exit_code: int | None) -> None:
        """Stop the samplers and finalize meta.json; a full or vanished --out is kept in
        ``write_error`` (the recording on disk is then shorter, never corrupt)."""
        for sampler in (self._gpu, self._host):
            if sampler is not None:
                sampler.stop()
        problems = list(self._problems)
        if self._gpu is not None:
            problems += [p for p in self._gpu.problems() if p not in problems]
        for sampler in (self._gpu, self._host):
            if sampler is not None:
                problems += [f"{sampler.name} sampler: {e}" for e in sampler.errors]
                error = getattr(sampler.writer, "error", None)
                if error is not None and self.write_error is None:
                    self.write_error = error
        self.meta.update(end_time=time.time(), status=status, exit_code=exit_code, nvml_problems=problems)
        self.meta["clock"] = [*self.meta.get("clock", [])[:1], _reading()]
        if self._host is not None:
            self.meta["sampling"] = {"adaptive": self.options.adaptive, "base_interval_s": self.options.interval_s,
                                     "last_interval_s": round(self._host.interval_s, 3),
                                     "host_rows": self._host.rows_written}
        if self.options.doctor_priority is not None:  # a doctor of its own (not the Python API's, in the training)
            self.meta["doctor_cpu_s"] = doctor_cpu(self.sampler_cpu_s())
        try:
            self.folder.write_meta(self.meta)
        except OSError as exc:
            self.write_error = self.write_error or exc


def doctor_cpu(samplers_s: float, **parts: float) -> dict[str, float]:
    """The doctor process's own CPU seconds by part (call on its main thread), and all its threads'."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    out = {"samplers": samplers_s, **parts, "main_thread": time.thread_time(),
           "process": own.ru_utime + own.ru_stime}
    return {k: round(v, 4) for k, v in out.items()}


def host_info() -> dict[str, Any]:
    import psutil

    return {
        "hostname": socket.gethostname(),
        "platform": platform_name(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "memory_total_mib": round(psutil.virtual_memory().total / 2**20),
    }


def platform_name() -> str:
    """``platform.platform()``'s words (``Linux-6.8.0-x86_64-with-glibc2.39``) from ``os.uname``:
    ``platform.platform()`` runs ``uname -p`` through PATH, which as root in a folder another
    user owns may be hers (an empty PATH entry is the current folder)."""
    u = os.uname()
    libc = "".join(platform.libc_ver())  # reads the interpreter's own file; spawns nothing
    return "-".join(w for w in (u.sysname, u.release, u.machine) if w) + (f"-with-{libc}" if libc else "")


def default_out(mode: str) -> Path:
    """Create and return a new ``reports/<mode>-<time>/`` (0700), unique even for two runs
    started in the same second: a taken name gets ``-2``, ``-3``... (see :mod:`recording.claim`).
    Refused in one line when another user can write the current folder (or one above it)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return unique_folder(Path("reports"), f"{mode}-{stamp}")


def _reading() -> dict[str, float]:
    """The wall clock and the monotonic clock at one moment (:mod:`gpudoctor.recording.clock`)."""
    return {"t": time.time(), "m": round(time.monotonic(), 4)}
