"""What a batch build is made of (CPU and waiting), and what N DataLoader workers make of the loop.

The hooks time every fetch (``__getitem__`` + collate, in the training process or a worker) with
its wall seconds, the process's CPU seconds (every thread: a tokenizer's pool counts), and the time
the calling thread sat runnable with no core (``schedstat``). What is left, wall less CPU less the
wait for a core, is time the build was blocked: storage, network, a sleep. A worker blocked there
needs no core, so a build that mostly waits is sized by Little's law (workers >= build wall / step
time), and a build that computes is capped by the cores the run can have; a mixed one is both.

One loop model for every figure a data rule prints, per batch::

    T(0) = what ran (measured)
    T(W) = max(compute,                          the loop never runs faster than its compute
               (build CPU + blocked) / W,        Little's law: W builds in flight, each on one
                                                 thread (a forked worker's tokenizer has no pool)
               (compute CPU + build CPU) / C)    the CPU all of it needs over the C cores it has

``C`` is the cores the run can have with W workers: on the host as it is, a fair share of its
cores among the run's 1 + W runnable processes and the ``crowd`` of other runnable ones
(``cores x (1 + W) / (1 + W + crowd)``; the crowd is what other programs kept busy, or more where
the build's own thread waited for a core, which only a crowd explains); on the host alone, every
core. W is the fewest workers within 5% of the best T (chosen
with 25% headroom on the build, as every worker count in :mod:`gpudoctor.rules.values`), capped by
memory and by the dataset's own batches per epoch, never the value that ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

WAITS = 0.5  # a build blocked at least half its wall is a waiting build
COMPUTES = 0.2  # blocked under a fifth of its wall: a CPU build; between the two: mixed
MAX_WORKERS = 32
ENOUGH = 1.05  # the fewest workers whose loop is within 5% of the best
WORKER_HEADROOM = 1.25  # workers build batches 25% faster than the loop eats them (the rules' too)


@dataclass(frozen=True)
class BuildCost:
    """One batch build, per batch, as measured in the process that built it.

    The fetching thread's own CPU (``thread_cpu_s``) and its wait for a core (``run_delay_s``) are
    the build's; the other threads' CPU in the same wall (``cpu_s - thread_cpu_s``) is the build's
    only where they truly worked for it: a thread pool the build calls (a tokenizer's), seen as
    other threads kept busy at least half the build's wall. A few ms of torch's OpenMP threads
    spinning down after the compute, or the doctor's own threads, are not (issue #40: a storage
    wait read as "11 ms of CPU, 0 ms blocked"; a Python build as more CPU than wall).
    """

    wall_s: float
    cpu_s: float  # every thread of the building process
    thread_cpu_s: float  # the calling thread alone
    run_delay_s: float  # the calling thread runnable, waiting for a core
    in_workers: bool
    pool: bool = True  # the build may call a thread pool (a tokenizer in the training process)

    @property
    def other_cpu_s(self) -> float:
        """CPU of the process's other threads during the builds."""
        return max(0.0, self.cpu_s - self.thread_cpu_s) if self.thread_cpu_s > 0 else 0.0

    @property
    def helped(self) -> bool:
        """Did other threads work for the build: busy at least half its wall beside it?"""
        return self.other_cpu_s >= 0.5 * self.wall_s > 0

    @property
    def build_cpu_s(self) -> float:
        """The build's own CPU: the fetching thread's, plus the other threads' where they helped."""
        if self.thread_cpu_s <= 0 or self.helped or self.pooled:
            return self.cpu_s
        return min(self.cpu_s, self.thread_cpu_s)

    @property
    def threads(self) -> float:
        """Threads the build kept busy on average (above 1: a thread pool a forked worker loses)."""
        return self.build_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def pooled(self) -> bool:
        """Did a thread pool the build calls (a tokenizer's) do most of its CPU? The calling thread
        then waits on it, and the pool's wait for a core is not in ``run_delay_s``."""
        other = self.other_cpu_s
        return self.cpu_s > 0 and other > 0.5 * self.cpu_s and (self.pool or other >= 0.5 * self.wall_s)

    @property
    def blocked_s(self) -> float:
        """Wall the build spent on no core and not queued for one: storage, network, sleep. A
        pooled build's off-CPU wall is its pool's (computing, or queued for cores), not I/O."""
        if self.pooled:
            return 0.0
        return max(0.0, self.wall_s - self.build_cpu_s - self.run_delay_s)

    @property
    def kind(self) -> str:
        share = self.blocked_s / self.wall_s if self.wall_s > 0 else 0.0
        return "wait" if share >= WAITS else "cpu" if share < COMPUTES else "mixed"

    @property
    def worker_wall_s(self) -> float:
        """Wall of one build in a worker: its CPU on one thread, its blocked time, and the wait for
        a core measured here (a worker on the same host waits for one as often)."""
        return self.build_cpu_s + self.blocked_s + self.run_delay_s

    def describe(self) -> str:
        ms = 1000.0
        text = (f"a batch build takes {ms * self.wall_s:.0f} ms: {ms * self.build_cpu_s:.0f} ms of CPU, "
                f"{ms * self.blocked_s:.0f} ms blocked (I/O, network, sleep)")
        if self.run_delay_s >= 0.05 * self.wall_s:
            text += f", {ms * self.run_delay_s:.0f} ms waiting for a core"
        if self.threads >= 1.2:
            text += f"; it kept {self.threads:.1f} threads busy (a forked worker builds on one)"
        elif self.build_cpu_s < self.cpu_s - 0.0005:
            text += (f"; the process's other threads used {ms * (self.cpu_s - self.build_cpu_s):.0f} ms of CPU "
                     "beside it (the compute's threads, not the build's)")
        return text


@dataclass(frozen=True)
class LoopModel:
    batch_s: float  # loop time per batch now (measured): compute plus the wait
    compute_s: float  # per batch, the training process outside the wait
    compute_cpu_s: float  # CPU per batch the run spends outside batch builds
    build: BuildCost
    workers_now: int
    warm: float = 1.0  # the compute back to back over the compute as measured, after a build (≤ 1)
    # the compute beside background workers burning the build's CPU over the compute as measured
    # (timed: warm_compute.json); None where not timed
    with_workers: float | None = None

    @property
    def compute_alone_s(self) -> float:
        """The compute per batch with no build before it: what a loop whose batches are ready runs at."""
        return self.compute_s * self.warm

    @property
    def workers_warm(self) -> float:
        """The warm ratio promised beside workers: a build that waits takes no core from the compute,
        which then runs back to back; workers that compute take cores the compute used, and the
        cold-start gain is not promised for them."""
        return self.warm if self.build.kind == "wait" else 1.0

    def batch_s_with(self, workers: int, host_cores: float, crowd: float = 0.0) -> float:
        """Loop time per batch with ``workers`` background workers on a host of ``host_cores``
        where ``crowd`` other processes compete for them."""
        if workers == self.workers_now:
            return self.batch_s
        cores = share(host_cores, workers, crowd)
        if workers <= 0:  # builds back in the training process, with its threads as measured there
            in_process = self.build.wall_s if not self.build.in_workers else self.build.worker_wall_s
            return max(self.compute_s + in_process, (self.compute_cpu_s + self.build.build_cpu_s) / max(cores, 1e-9))
        warm = self.workers_warm
        # Timed beside a process burning the build's CPU, where no worker ran: the compute's threads
        # lose a core to it for that long (each op then waits for the thread it lost), which the
        # CPU summed over the cores below does not see.
        beside = self.with_workers if self.with_workers is not None and self.workers_now == 0 else warm
        model = max(self.compute_s * beside, self.build.worker_wall_s / workers,
                    (self.compute_cpu_s * warm + self.build.build_cpu_s) / max(cores, 1e-9))
        if self.workers_now > 0:  # what the model misses now (IPC, collation) it misses with more workers too
            now = max(self.compute_s, self.build.worker_wall_s / self.workers_now,
                      (self.compute_cpu_s + self.build.build_cpu_s) / max(share(host_cores, self.workers_now, crowd), 1e-9))
            model *= max(1.0, self.batch_s / now) if now > 0 else 1.0
        return model

    def littles_law(self, target_s: float) -> int:
        """Workers Little's law asks for to deliver a batch every ``target_s``."""
        return max(1, math.ceil(self.build.worker_wall_s / max(target_s, 1e-9)))

    def choose(self, cores: float, cap: int, crowd: float = 0.0) -> tuple[int, float]:
        """(workers, loop time per batch with them): the fewest within 5% of the best up to ``cap``,
        chosen with builds 25% slower than measured (``WORKER_HEADROOM``: build times vary, and a
        queue run at its exact rate is often empty); the time returned is the model's own."""
        # Past what Little's law asks for (with the headroom), a worker only takes cores from other programs.
        need = math.ceil(WORKER_HEADROOM * self.build.worker_wall_s / max(self.compute_s * self.workers_warm, 1e-9))
        cap = max(1, min(cap, MAX_WORKERS, need))
        if self.build.kind != "wait":  # a build that computes: never more workers than the host has cores
            cap = max(1, min(cap, math.floor(cores)))
        slack = LoopModel(self.batch_s, self.compute_s, self.compute_cpu_s,
                          replace(self.build, wall_s=self.build.wall_s * WORKER_HEADROOM,
                                  cpu_s=self.build.cpu_s * WORKER_HEADROOM,
                                  run_delay_s=self.build.run_delay_s * WORKER_HEADROOM), self.workers_now, self.warm,
                          self.with_workers)
        times = {w: slack.batch_s_with(w, cores, crowd) for w in range(1, cap + 1)}
        best = min(times.values())
        workers = min(w for w, t in times.items() if t <= best * ENOUGH)
        return workers, self.batch_s_with(workers, cores, crowd)

    def speedup(self, batch_s: float) -> float:
        return self.batch_s / batch_s if batch_s > 0 else 1.0


def share(host_cores: float, workers: int, crowd: float) -> float:
    """Cores the run's 1 + ``workers`` processes get among ``crowd`` other runnable ones."""
    mine = 1.0 + max(0, workers)
    return min(host_cores, host_cores * mine / (mine + max(0.0, crowd)))


def crowd_of(host_cores: float, other_cores: float, build: BuildCost) -> float:
    """Other runnable processes: what other programs kept busy, or, where the build's thread waited
    for a core, as many as that wait implies (a thread runnable a share f of the time it gets a
    core, on ``host_cores`` cores, shares them with about ``host_cores / f - 1`` others)."""
    runnable = build.thread_cpu_s + build.run_delay_s
    if runnable < 0.5 * build.wall_s:  # a build that mostly sleeps: its wake-ups' waits say little of the crowd
        return other_cores
    got = build.thread_cpu_s / runnable if runnable > 0 else 1.0
    implied = host_cores / got - 1.0 if 0 < got < 0.9 else 0.0
    return max(other_cores, implied)


def worker_cap(mem_available_mib: float | None, rss_mib: float | None, procs_now: int,
               dataset_len: int | None, batch_size: int | None) -> tuple[int, str | None]:
    """The most workers memory and the dataset allow, and what set it (None: only the hard cap).

    Memory: each worker may grow to the training process's size (forked pages are shared until
    written, so this is the worst case). Dataset: a worker with no batch of an epoch is idle."""
    cap, why = MAX_WORKERS, None
    if mem_available_mib and rss_mib and procs_now > 0:
        per = rss_mib / procs_now
        by_mem = int(mem_available_mib / per) if per > 0 else MAX_WORKERS
        if by_mem < cap:
            cap, why = max(1, by_mem), f"{mem_available_mib / 1024:.1f} GiB free at {per:.0f} MiB a worker"
    if dataset_len and batch_size:
        batches = math.ceil(dataset_len / batch_size)
        if batches < cap:
            cap, why = max(1, batches), f"the dataset has {batches} batches an epoch"
    return cap, why
