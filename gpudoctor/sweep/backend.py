"""Where a sweep's trials run: this machine, one process at a time (the default), or Ray.

A backend takes :class:`TrialJob` s and hands back each one's :class:`TrialRun` as it
finishes; the runner around it keeps the cache, the repeats of noisy points, the
records and the progress display, so they are the same whichever backend ran the
trial. The Ray backend is in :mod:`gpudoctor.sweep.ray_backend` (ray is optional).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol as TypingProtocol

from gpudoctor.samplers.nvml import Nvml
from gpudoctor.samplers.tree import open_nvml
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.results import available_cores
from gpudoctor.sweep.trial import TrialRun, Watch, prepare, run_trial


@dataclass
class TrialJob:
    """One run of one point: its config (text, and the file in the driver's cache) and where
    its run folder goes there."""

    key: str
    label: str
    config_yaml: Path
    yaml_text: str
    run_dir: Path
    protocol: Protocol
    timeout_s: float
    batch_size: int
    workers: int
    prepare_key: str
    attempt: int = 0
    watch: Watch | None = field(default=None, repr=False)


class Backend(TypingProtocol):
    name: str
    cores: int  # the most cores one trial can have (the plan skips worker counts above it)
    gpu: bool  # trials train on a GPU
    slots: int  # trials that can run at once
    on_start: Callable[[TrialJob], None] | None

    def submit(self, job: TrialJob) -> None: ...
    def next_done(self) -> tuple[TrialJob, TrialRun]: ...
    def pending(self) -> int: ...
    def close(self) -> None: ...


class LocalBackend:
    """One trial process at a time on this machine, watched by the driver's own NVML."""

    name = "local"
    slots = 1

    def __init__(self) -> None:
        self.nvml: Nvml | None = open_nvml()
        self.cores = available_cores()
        self.gpu = self.nvml is not None
        self.on_start: Callable[[TrialJob], None] | None = None
        self._queue: deque[TrialJob] = deque()
        self._prepared: dict[str, TrialRun | None] = {}

    def submit(self, job: TrialJob) -> None:
        self._queue.append(job)

    def pending(self) -> int:
        return len(self._queue)

    def next_done(self) -> tuple[TrialJob, TrialRun]:
        job = self._queue.popleft()
        if job.prepare_key not in self._prepared:  # once per distinct input side
            self._prepared[job.prepare_key] = prepare(job.config_yaml, job.timeout_s)
        failed = self._prepared[job.prepare_key]
        if failed:
            return job, replace(failed)  # each point its own record
        if self.on_start is not None:
            self.on_start(job)
        run = run_trial(
            job.config_yaml,
            job.run_dir,
            job.protocol,
            job.timeout_s,
            job.batch_size,
            self.nvml,
            job.watch,
        )
        return job, run

    def close(self) -> None:
        self._queue.clear()

