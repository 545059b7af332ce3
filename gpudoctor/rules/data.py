"""Rules about the input pipeline: why the loop waits for batches, and what fixes it.

A data wait has one cause at a time, and each rule claims only its own part so
the wastes never double count: tokenizer time on the training process goes to
``tokenization_in_loop``; what remains is decided by where the batch build's
time went (:mod:`gpudoctor.analysis.buildcost`), not by how busy the host is:
a build that mostly waits (storage, network, sleep) is ``io_bound`` and sized
by Little's law; a build that computes is ``data_stall`` while more workers
help on the cores the run can have, else ``cpu_saturated`` (which names the
other programs that hold cores). Recordings without a build's CPU (older
writers, stack samples) fall back to the host's iowait and busy cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.buildcost import BuildCost, LoopModel, crowd_of, share, worker_cap
from gpudoctor.common.wording import plural
from gpudoctor.core.events import LoaderEvent
from gpudoctor.core.thresholds import WASTE_SHARE, percent
from gpudoctor.recording.warm_compute import WarmCompute
from gpudoctor.rules import values, vocabulary
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.names import Names, names_for

MIN_SHARE = WASTE_SHARE
# ``finding.data`` key: the fix computes each item once before training ("pretokenize": the
# tokenizer's part; "cache": the whole item); rules/script_flags.py sets the script's flag for it.
PRECOMPUTE = "precompute"
IOWAIT_PCT = 20.0
CPU_SATURATED_PCT = 90.0
_WAIT = percent(WASTE_SHARE)
BETTER = 1.05  # one fix leads another where it gives 5% more per batch (the best fix first)


@dataclass
class DataWait:
    """The data path's figures, which every data rule reads (figures only: the rules word them)."""

    wall_s: float
    wait_s: float
    compute_s: float
    n_batches: int
    tokenize_in_loop_s: float  # tokenizer time on the training process after the first step
    tokenize_in_wait_s: float  # the part of it spent inside DataLoader waits
    load_s_per_batch: float | None  # cost to build one batch in one process
    compute_s_per_batch: float | None
    num_workers: int | None
    cores: int
    training_procs: int
    cpu_run_cores: float | None  # cores the run's processes kept busy during the loop
    cpu_total_pct: float | None
    iowait_pct: float | None
    names: Names
    build: BuildCost | None = None  # what a batch build is made of, when the hooks timed its CPU
    compute_cpu_s: float | None = None  # CPU per batch the run spends outside batch builds
    others: tuple[tuple[str, float], ...] = ()  # other programs: (command, cores busy)
    cap: tuple[int, str | None] = (32, None)  # most workers memory and the dataset allow, and why
    tokenize_cpu_s: float | None = None  # process CPU of the in-loop tokenizer calls, when timed
    warm: WarmCompute | None = None  # the compute back to back against after a build, timed after the run

    @property
    def model(self) -> LoopModel | None:
        if self.build is None or not self.batch_s or self.compute_s_per_batch is None:
            return None
        return LoopModel(batch_s=self.batch_s, compute_s=self.compute_s_per_batch,
                         compute_cpu_s=self.compute_cpu_s if self.compute_cpu_s is not None else self.compute_s_per_batch,
                         build=self.build, workers_now=self.num_workers or 0, warm=self.warm_ratio,
                         with_workers=self.warm.with_workers if self.warm is not None else None)

    @property
    def warm_ratio(self) -> float:
        """The compute back to back over the compute as measured between builds (1 where not timed)."""
        return self.warm.ratio if self.warm is not None else 1.0

    @property
    def cold_s(self) -> float:
        """Seconds of the loop's compute that a loop with its batches ready does not spend: the
        compute runs colder right after a build than back to back (0 where not timed)."""
        rest = max(0.0, self.compute_s - (self.tokenize_in_loop_s - self.tokenize_in_wait_s))
        return rest * (1.0 - self.warm_ratio)

    def ready_claims(self, removed_s: float, up_to_s: float | None = None) -> list[Claim]:
        """A fix that gives back ``removed_s`` of the loop's time with its batches then ready: the
        loader's part of the wait, and past the wait the compute's cold part (never more)."""
        out = [self.residual_claim(min(self.residual_s, removed_s),
                                   up_to_s=None if up_to_s is None else min(self.residual_s, up_to_s))]
        return out + self.cold_claims(removed_s - self.wait_s)

    def cold_claims(self, removed_s: float) -> list[Claim]:
        """``removed_s`` of the compute's cold part (at most all of it), where it was timed."""
        colder = min(self.cold_s, max(0.0, removed_s))
        return [claim("compute", colder, self.compute_s, part="cold", part_s=self.cold_s)] if colder > 0 else []

    def diagnose(self) -> Diagnosis | None:
        """Where the build's time went, and the worker count on this host and on the host alone."""
        m = self.model
        if m is None or self.build is None:
            return None
        here = m.choose(float(self.cores), self.cap[0], crowd_of(float(self.cores), self.other_cores, self.build))
        alone = m.choose(float(self.cores), self.cap[0])
        helps = here[0] != (self.num_workers or 0) and m.speedup(here[1]) >= 1.05
        kind = "io_bound" if self.build.kind == "wait" else "data_stall" if helps else "cpu_saturated"
        return Diagnosis(kind, m, here if helps else None, alone if alone[0] != (self.num_workers or 0)
                         and m.speedup(alone[1]) >= 1.05 else None)

    @property
    def residual_s(self) -> float:
        # The tokenizer's part is tokenization_in_loop's only when that rule fires; else no finding
        # would claim it, and the loader's fixes (workers, a cache) remove it with the rest.
        return max(0.0, self.wait_s - self.tokenize_in_wait_s) if self.tokenizer_fires else self.wait_s

    @property
    def tokenizer_fires(self) -> bool:
        """Whether tokenization_in_loop claims the tokenizer's part of the wait (its threshold)."""
        return self.wall_s > 0 and self.tokenize_in_loop_s / self.wall_s >= MIN_SHARE

    @property
    def tokenizer_leads(self) -> bool:
        """Whether the tokenizer calls are most of the batch build (tokenization_in_loop fires and
        its seconds pass the rest of the wait): computing the items once is then that finding's
        fix, and the loader's rules claim only the rest, so the cause named first is the tokenizer."""
        return self.tokenizer_fires and self.tokenize_in_loop_s >= self.residual_s

    def whole_build_claims(self) -> list[Claim]:
        """Every item computed once before training: the whole wait goes, and the tokenizing the
        loop did outside it (a cache, or a switch that caches whole items)."""
        out = [claim("data_wait", self.wait_s, self.wait_s),
               claim("compute", self.tokenize_in_loop_s - self.tokenize_in_wait_s, self.compute_s)]
        return out + self.cold_claims(self.cold_s)  # and the compute then runs back to back

    def stall_data(self) -> dict[str, object]:
        """The figures a data_stall finding carries, whichever fix leads it."""
        return {
            "data_wait_s": round(self.wait_s, 3),
            "load_ms_per_batch": round(1000 * self.load_s_per_batch, 2) if self.load_s_per_batch else None,
            "compute_ms_per_batch": round(1000 * self.compute_s_per_batch, 2) if self.compute_s_per_batch else None,
            "cores": self.cores,
            "free_cores": self.free_cores,
            **({"compute_alone_ms_per_batch": round(1000 * self.compute_s_per_batch * self.warm_ratio, 2),
                "compute_alone_basis": self.warm_words()} if self.warm is not None and self.compute_s_per_batch else {}),
            **({"compute_with_workers_ms_per_batch": round(1000 * self.compute_s_per_batch * self.warm.with_workers, 2)}
               if self.warm is not None and self.warm.with_workers is not None and self.compute_s_per_batch else {}),
        }

    def warm_words(self) -> str:
        """How the compute back to back was found, for the evidence."""
        w = self.warm
        if w is None:
            return ""
        after = "a sleep" if w.gap == "wait" else "Python work"
        beside = (f", beside {plural(w.beside, 'busy process', 'busy processes')} standing in for the "
                  "workers' CPU" if w.beside else "")
        workers = (f", and {1000 * w.worker_s:.1f} ms back to back beside a process burning the build's "
                   f"{1000 * w.worker_cpu_s:.0f} ms of CPU each step, as a background worker would"
                   if w.worker_s is not None and w.worker_cpu_s is not None else "")
        return (f"a stand-in step ({w.stand_in}) took {1000 * w.warm_s:.1f} ms back to back and "
                f"{1000 * w.cold_s:.1f} ms right after {1000 * w.gap_s:.0f} ms of {after}{beside}{workers} "
                "on this machine" + (f" (the median of {w.draws} processes)" if w.draws > 1 else ""))

    def residual_claim(self, removed_s: float, up_to_s: float | None = None) -> Claim:
        """``removed_s`` of the wait that is not the tokenizer's (a disjoint part of data_wait)."""
        return claim("data_wait", removed_s, self.wait_s, part="loader", part_s=self.residual_s, up_to_s=up_to_s)

    @property
    def other_cores(self) -> float:
        """Cores other programs kept busy during the loop: a worker cannot have those."""
        if self.cpu_total_pct is None or self.cpu_run_cores is None:
            return 0.0
        return max(0.0, self.cpu_total_pct / 100.0 * self.cores - self.cpu_run_cores)

    @property
    def capacity_cores(self) -> float:
        """Cores the run's own processes can use: all of them, less what others kept busy."""
        return max(1.0, self.cores - self.other_cores)

    def model_cores(self, workers: int) -> float:
        """Cores the run's processes get with ``workers`` beside the other programs (a fair share)."""
        crowd = crowd_of(float(self.cores), self.other_cores, self.build) if self.build else self.other_cores
        return share(float(self.cores), workers, crowd)

    @property
    def free_cores(self) -> int:
        """Cores left for DataLoader workers: each training process keeps one busy, and cores
        other programs keep busy are not free either."""
        return max(0, int(self.capacity_cores + 0.25) - self.training_procs)

    @property
    def batch_s(self) -> float | None:
        """Loop time per batch now: compute plus the wait."""
        if not self.compute_s_per_batch or not self.n_batches:
            return None
        return self.compute_s_per_batch + self.wait_s / self.n_batches

    def worker_batch_s(self, workers: int) -> tuple[float, float] | None:
        """(slowest, fastest) loop time per batch with ``workers`` background workers.

        A batch takes at least its compute, the build time over the workers, and the run's
        CPU work now spread over the cores it can have (a worker cannot give back time the
        cores do not have). What the hooks do not measure widens it: how many threads a
        batch build used in the training process, where a forked worker builds on one
        (``tokenizers`` turns its thread pool off after a fork).
        """
        t0 = self.batch_s
        if t0 is None or not self.load_s_per_batch or workers <= 0:
            return None
        compute = self.compute_s_per_batch or 0.0
        run_cores = self.cpu_run_cores or float(self.training_procs)
        cpu_bound = run_cores * t0 / self.capacity_cores
        fast = max(compute, self.load_s_per_batch / workers, cpu_bound)
        single_thread_load = self.load_s_per_batch * max(1.0, min(run_cores, self.capacity_cores))
        slow = max(compute, single_thread_load / workers, cpu_bound)
        return min(slow, t0), min(fast, t0)

    @property
    def io_dominated(self) -> bool:
        return self.iowait_pct is not None and self.iowait_pct >= IOWAIT_PCT

    @property
    def cpu_saturated(self) -> bool:
        return self.cpu_total_pct is not None and self.cpu_total_pct >= CPU_SATURATED_PCT

    def workers_needed(self) -> int | None:
        if not self.load_s_per_batch or not self.compute_s_per_batch:
            return None
        return values.workers_needed(self.load_s_per_batch, self.compute_s_per_batch)


@dataclass(frozen=True)
class Diagnosis:
    kind: str  # "io_bound" | "data_stall" | "cpu_saturated"
    model: LoopModel
    here: tuple[int, float] | None  # (workers, loop s per batch) on the host as it is; None: none helps
    alone: tuple[int, float] | None  # the same on the host with no other program

    def little(self) -> int:
        return self.model.littles_law(self.model.compute_s)


def data_wait(a: Analysis) -> DataWait | None:
    p = a.primary
    if p is None:
        return None
    names = names_for(p)
    n = max(p.n_data_waits, 1)
    compute_s = p.seconds("compute")
    load = p.fetch_s / p.fetch_calls if p.fetch_calls else None
    workers = names.current("dataloader_num_workers", "num_workers")
    wait_s = p.seconds("data_wait")
    tokenize_s = p.tokenize_in_loop_s if _tokenizes_in_main(names) else 0.0
    build = None
    if p.fetch_cpu_calls and p.fetch_timed_s > 0:
        n_timed = p.fetch_cpu_calls
        build = BuildCost(wall_s=p.fetch_timed_s / n_timed, cpu_s=p.fetch_cpu_s / n_timed,
                          thread_cpu_s=p.fetch_thread_cpu_s / n_timed, run_delay_s=p.fetch_run_delay_s / n_timed,
                          in_workers=p.fetch_in_workers * 2 > p.fetch_calls,
                          pool=p.tokenize_in_loop_s > 0 or p.tokenize_timed_s > 0)
    compute_cpu = None
    if build is not None and a.host.cpu_run_cores is not None and p.n_data_waits:
        batch = (compute_s + wait_s) / p.n_data_waits
        compute_cpu = max(0.0, a.host.cpu_run_cores * batch - build.build_cpu_s)
    loader = p.loaders[0] if p.loaders else LoaderEvent(k="loader")
    cap = worker_cap(a.host.mem_available_mib, a.host.rss_max_mib, 1 + (int(workers) if isinstance(workers, (int, float)) else 0),
                     loader.get("dataset_len"), loader.get("batch_size"))
    return DataWait(
        wall_s=p.wall_s,
        wait_s=wait_s,
        compute_s=compute_s,
        n_batches=p.n_data_waits,
        tokenize_in_loop_s=tokenize_s,
        tokenize_in_wait_s=min(tokenize_s, wait_s) if p.n_data_waits else 0.0,
        load_s_per_batch=load,
        compute_s_per_batch=compute_s / n if p.n_data_waits else None,
        num_workers=int(workers) if isinstance(workers, (int, float)) else None,
        cores=a.host.cores or 1,
        training_procs=max(1, len(a.procs)),
        cpu_run_cores=a.host.cpu_run_cores,
        cpu_total_pct=a.host.cpu_total_pct,
        iowait_pct=a.host.iowait_pct,
        names=names,
        build=build,
        compute_cpu_s=compute_cpu,
        tokenize_cpu_s=(p.tokenize_cpu_s * tokenize_s / p.tokenize_timed_s
                        if tokenize_s and p.tokenize_timed_s > 0 else None),
        warm=a.rec.warm_compute,
        others=tuple(a.host.others),
        cap=cap,
    )


def _tokenizes_in_main(names: Names) -> bool:
    # With workers, the main process's tokenizer calls are not what it waits on.
    workers = names.current("dataloader_num_workers", "num_workers")
    return not workers


# --- figures: how many workers, and what they give back ------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    """The worker count a data finding recommends and the loop's time per batch with it: worded
    by :func:`worker_words`. ``workers`` 0 and no config where no worker count beats what ran."""

    workers: int
    predicted: tuple[float, float] | None  # (slowest, fastest) loop s per batch with them
    diagnosis: Diagnosis | None  # the loop model's, where the hooks timed the build's CPU
    needed: int = 0  # else: workers the load cost needs (the measured need)
    config: dict[str, object] = field(default_factory=dict)  # the worker settings that change


def worker_plan(d: DataWait) -> WorkerPlan:
    """Recommend a worker count and predict the loop's time per batch with it.

    Where the hooks timed the build's CPU, from the loop model (Little's law for what the build
    waits, the cores the run can have for what it computes); else from the load cost and the
    free cores.
    """
    diag = d.diagnose()
    if diag is not None:
        if diag.here is None:
            return WorkerPlan(0, None, diag)
        workers, t = diag.here
        return WorkerPlan(workers, (t, t), diag, config=_loader_config(d, workers))
    needed = d.workers_needed() or 2
    workers = values.workers_for(needed, d.free_cores)
    if workers == (d.num_workers or 0):
        workers = 0
    return WorkerPlan(workers, loop_batch_s(d, workers), None, needed,
                      _loader_config(d, workers) if workers else {})


def loop_batch_s(d: DataWait, workers: int) -> tuple[float, float] | None:
    """The one prediction of a worker count: (slowest, fastest) loop seconds per batch with
    ``workers``, for the findings and ``try`` alike. The loop model where the hooks timed the
    build's CPU (one figure), else the load cost and the free cores (a range)."""
    diag = d.diagnose()
    if diag is not None and d.build is not None:
        t = diag.model.batch_s_with(workers, float(d.cores), crowd_of(float(d.cores), d.other_cores, d.build))
        return t, t
    return d.worker_batch_s(workers)


def worker_fix(d: DataWait) -> tuple[int, Fix, tuple[float, float] | None]:
    """(workers, fix, (slowest, fastest) loop s per batch): :func:`worker_plan`, worded."""
    plan = worker_plan(d)
    return plan.workers, worker_words(d, plan), plan.predicted


def _loader_config(d: DataWait, workers: int) -> dict[str, object]:
    """The worker settings as the script's own call takes them; only what changes."""
    names = d.names
    wanted: dict[tuple[str, str], object] = {("dataloader_num_workers", "num_workers"): workers}
    if workers:
        wanted |= {("dataloader_persistent_workers", "persistent_workers"): True,
                   ("dataloader_prefetch_factor", "prefetch_factor"): 2}
    # A Trainer builds its DataLoader itself: only the TrainingArguments fields it has can be set.
    return {
        (key if names.is_trainer else arg): value
        for (key, arg), value in wanted.items()
        if (not names.is_trainer or names.has(key)) and names.current(key, arg) != value  # never a no-op
    }


def _alone_data(d: DataWait, diag: Diagnosis | None) -> dict[str, object]:
    """The figures every data finding carries: one value and one prediction per knob."""
    if diag is None:
        return {}
    m = diag.model
    return {
        "build_ms": round(1000 * m.build.wall_s, 2), "build_cpu_ms": round(1000 * m.build.build_cpu_s, 2),
        "build_blocked_ms": round(1000 * m.build.blocked_s, 2), "build_threads": round(m.build.threads, 2),
        "build_kind": m.build.kind, "littles_law_workers": diag.little(),
        "workers_here": diag.here[0] if diag.here else None,
        "predicted_loop_speedup": round(m.speedup(diag.here[1]), 3) if diag.here else None,
        "workers_host_alone": diag.alone[0] if diag.alone else None,
        "predicted_loop_speedup_host_alone": round(m.speedup(diag.alone[1]), 3) if diag.alone else None,
        "other_programs": [{"name": n, "cores": round(c, 2)} for n, c in d.others[:5]],
        "other_cores": round(d.other_cores, 2),
    }


# --- words: the worker fix, the wait, the other programs -----------------------------------------


def _with_values(summary: str, config: dict[str, object]) -> str:
    """An alternative's words, lower-cased to follow a clause, its values named before its full stop."""
    said = summary[0].lower() + summary[1:]
    if not config:
        return said
    values = ", ".join(f"{k}={v!r}" for k, v in config.items())
    return f"{said[:-1]} ({values})." if said.endswith(".") else f"{said} ({values})"


def _gain(x: float) -> str:
    return f"{x:.2f}x"


def _loader_snippet(names: Names, cfg: dict[str, object]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
    return f"TrainingArguments(..., {args})" if names.is_trainer else f"DataLoader(dataset, batch_size=..., {args})"


def worker_words(d: DataWait, plan: WorkerPlan) -> Fix:
    """The fix of a :class:`WorkerPlan`: the worker count, why, and the loop's gain with it."""
    if plan.diagnosis is not None:
        return _measured_worker_words(d, plan, plan.diagnosis)
    names, workers, needed, predicted = d.names, plan.workers, plan.needed, plan.predicted
    busy = f" and other programs keep {d.other_cores:.1f} busy" if d.other_cores >= 0.25 else ""
    limit = (
        f"; {d.cores} cores with {plural(d.training_procs, 'training process', 'training processes')}{busy} leave {d.free_cores} for workers"
        if needed > d.free_cores
        else ""
    )
    gain = ""
    if predicted is not None and d.batch_s:
        low, high = d.batch_s / predicted[0], d.batch_s / predicted[1]
        gain = f": about {low:.2f}x" if high - low < 0.01 else f": {low:.2f}-{high:.2f}x"
        gain += " faster per batch on this machine"
    summary = (
        f"Load batches in {plural(workers, 'background worker')} (measured need: {needed}{limit}){gain}."
        if workers
        else f"No core is free for more DataLoader workers ({d.cores} cores{busy}); move the per-batch work offline."
    )
    snippet = _loader_snippet(names, plan.config) if workers else None
    return Fix(summary=summary, config=plan.config, snippet=snippet, library=names.library, call=names.call)


def _measured_worker_words(d: DataWait, plan: WorkerPlan, diag: Diagnosis) -> Fix:
    m, names = diag.model, d.names
    assert d.build is not None
    others = others_words(d)
    alone = ""
    if others and diag.alone is not None and diag.alone != diag.here:
        alone = (f" During the loop {others}; on the host alone {plural(diag.alone[0], 'worker')} would give "
                 f"{_gain(m.speedup(diag.alone[1]))}.")
    elif others and diag.alone is None:
        alone = f" During the loop {others}; on the host alone no worker count would do better either."
    if diag.here is None:
        summary = (f"No worker count beats the {d.num_workers or 0} that ran on the "
                   f"{d.model_cores(d.num_workers or 0):.1f} cores this run can have: {d.build.describe()}.{alone}")
        return Fix(summary=summary, library=names.library, call=names.call)
    workers, t = diag.here
    why = (f"Little's law: {1000 * m.build.worker_wall_s:.0f} ms a build in a worker / "
           f"{1000 * m.compute_s:.0f} ms of compute a batch = {diag.little()} in flight")
    if d.build.kind != "wait":
        why += f"; the CPU it needs on the {d.model_cores(workers):.1f} cores this run can have with them"
    if d.cap[1] and workers >= d.cap[0]:
        why += f"; capped at {d.cap[0]} by {d.cap[1]}"
    summary = (f"Load batches in {plural(workers, 'background worker')} ({why}): about {_gain(m.speedup(t))} "
               f"faster per batch on this host as it is.{alone}")
    return Fix(summary=summary, config=plan.config, snippet=_loader_snippet(names, plan.config),
               library=names.library, call=names.call)


def others_words(d: DataWait) -> str:
    """The other programs that kept cores busy, named: "python3 (1.0 core), make (0.3)"."""
    named = [(n, c) for n, c in d.others if c >= 0.1]
    if not named:
        return f"other programs kept {d.other_cores:.1f} cores busy" if d.other_cores >= 0.25 else ""
    listed = ", ".join(f"{n} ({c:.1f} core{'s' if c >= 1.05 else ''})" for n, c in named[:3])
    return f"other programs kept {d.other_cores:.1f} of {d.cores} cores busy: {listed}"


def _wait_evidence(d: DataWait) -> str:
    per_batch = d.wait_s / max(d.n_batches, 1)
    evidence = (
        f"The loop waited {d.wait_s:.1f} s for batches ({pct(d.wait_s / d.wall_s)} of wall), "
        f"{1000 * per_batch:.0f} ms per batch with {plural(d.num_workers or 0, 'worker')}; "
    )
    if d.build is not None and d.compute_s_per_batch is not None:
        evidence += f"{d.build.describe()}, against {1000 * d.compute_s_per_batch:.0f} ms of compute per batch."
        if d.warm is not None and d.warm_ratio < 1.0:
            evidence += (f" Back to back that compute takes about {1000 * d.compute_s_per_batch * d.warm_ratio:.0f} ms "
                         f"({d.warm_words()}).")
    elif d.load_s_per_batch is not None and d.compute_s_per_batch is not None:
        evidence += (
            f"building a batch costs {1000 * d.load_s_per_batch:.0f} ms against "
            f"{1000 * d.compute_s_per_batch:.0f} ms of compute per batch."
        )
    others = others_words(d)
    if others:
        evidence += f" During the loop {others}."
    return evidence


# --- the rules: each computes its figures, then words them in one place --------------------------


@dataclass(frozen=True)
class TokenizeFigures:
    """Tokenizing in the loop and the fix's values: worded by ``_word_tokenize``."""

    d: DataWait
    waste: float  # the tokenizer's share of wall time
    interim: WorkerPlan  # workers until the data is pre-tokenized
    multiple: int  # the collator's pad multiple (1: each batch to its longest row exactly)
    max_length: int | None  # truncation for the offline map

    @property
    def num_proc(self) -> int:
        return max(1, self.d.cores)


class TokenizationInLoop(Rule):
    name = "tokenization_in_loop"
    fires_when = f'the training process tokenizes ≥ {_WAIT} of wall after the first step'
    fix_from = 'pre-tokenize offline (gives back the measured tokenizer seconds); meanwhile workers, sized as for `data_stall`'

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None:
            return None
        waste = d.tokenize_in_loop_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        pad = a.padding()
        multiple = values.pad_multiple_for(pad.get("p50_length"))
        max_len = values.max_length_for(pad.get("p99_length"), pad.get("max_length"), multiple=multiple)
        # the collator's rounding, as the padding fix gives it: exactly on a CPU, a multiple on CUDA
        per_batch = values.batch_multiple(a, multiple)
        return _word_tokenize(TokenizeFigures(d, waste, worker_plan(d), per_batch, max_len))


def _word_tokenize(fig: TokenizeFigures) -> Finding:
    d, num_proc = fig.d, fig.num_proc
    interim = worker_words(d, fig.interim)
    truncate = f", max_length={fig.max_length}" if fig.max_length else ""
    snippet = (
        "# once, on a CPU machine, before renting GPUs:\n"
        f"ds = ds.map(lambda b: tokenizer(b['text'], truncation=True{truncate}),\n"
        f"            batched=True, num_proc={num_proc}, remove_columns=['text'])\n"
        "ds.save_to_disk('data/tokenized')\n"
        "# in the training script:\n"
        "ds = datasets.load_from_disk('data/tokenized')\n"
        "collator = DataCollatorWithPadding(tokenizer"
        + (f", pad_to_multiple_of={fig.multiple})" if fig.multiple > 1 else ")")
    )
    data = _tokenize_data(d, fig.interim.workers, fig.interim.predicted)
    pre, meanwhile = data.get("predicted_loop_speedup"), data.get("interim_loop_speedup")
    evidence = (f"{d.tokenize_in_loop_s:.1f} s of tokenizer calls on the training process after the first step "
                f"({pct(fig.waste)} of wall time), while the loop waited {d.wait_s:.1f} s for batches "
                f"with {plural(d.num_workers or 0, 'DataLoader worker')}.")
    pretokenize = (f"pre-tokenize once with datasets.map(batched=True, num_proc={num_proc}) and save_to_disk: that "
                   f"gives back the {d.tokenize_in_loop_s:.1f} s of tokenizing"
                   + (f", about {pre:.2f}x faster per batch" if isinstance(pre, float) else ""))
    base = {"tokenize_in_loop_s": round(d.tokenize_in_loop_s, 3), "data_wait_s": round(d.wait_s, 3), **data}
    if (isinstance(pre, float) and isinstance(meanwhile, float) and meanwhile > BETTER * pre
            and fig.interim.config and fig.interim.predicted is not None and d.batch_s
            and fig.interim.diagnosis is not None):  # the loop model's figure, from the build's measured CPU
        # The best fix first (#40 item 4): the workers also hide the rest of the batch build, and
        # give more than pre-tokenizing alone; they are the fix, pre-tokenizing the alternative.
        removed = d.n_batches * (d.batch_s - fig.interim.predicted[0])
        return Finding(
            rule=TokenizationInLoop.name, title="Tokenizing inside the training loop",
            claims=[claim("data_wait", min(d.wait_s, removed), d.wait_s),
                    *d.cold_claims(removed - d.wait_s)], evidence=evidence,
            fix=Fix(summary=f"{interim.summary} It beats pre-tokenizing alone, since the rest of the batch build "
                    f"is hidden too; or {pretokenize}.",
                    config=interim.config, snippet=interim.snippet, library=interim.library, call=interim.call),
            data={**base, "alternative_precompute": "pretokenize"},
        )
    return Finding(
        rule=TokenizationInLoop.name,
        title="Tokenizing inside the training loop",
        # Pre-tokenized data removes the tokenizer's part of the wait; time it spent outside a
        # wait (after a batch arrived) is in compute.
        claims=[claim("data_wait", d.tokenize_in_wait_s, d.wait_s, part="tokenize", part_s=d.tokenize_in_wait_s),
                claim("compute", d.tokenize_in_loop_s - d.tokenize_in_wait_s, d.compute_s)],
        evidence=evidence,
        fix=Fix(
            summary=f"{pretokenize[0].upper()}{pretokenize[1:]}. Until then, {_with_values(interim.summary, interim.config)}",
            # One knob, one prediction: the fix's values are pre-tokenizing's (the script's own flag
            # for it, where it has one: rules/script_flags.py); the interim workers are the
            # alternative, with their own figure in ``data``, never set beside it.
            config={"batched": True, "num_proc": num_proc},
            snippet=snippet,
            library="datasets.Dataset.map",
            call="ds.map",
        ),
        data={**base, PRECOMPUTE: "pretokenize", **({"alternative": interim.config} if interim.config else {})},
        # a switch that caches each whole item removes the whole wait, not the tokenizer's part only
        switch_claims={"cache": d.whole_build_claims()},
    )


def _tokenize_data(d: DataWait, workers: int, interim_t: tuple[float, float] | None) -> dict[str, object]:
    """Pre-tokenizing's loop speedup (the tokenizer's wall per batch gone) and the interim workers'."""
    out: dict[str, object] = {}
    if d.batch_s and d.n_batches:
        after = d.batch_s - d.tokenize_in_loop_s / d.n_batches
        out["predicted_loop_speedup"] = round(d.batch_s / after, 3) if after > 0 else None
    if d.tokenize_in_loop_s > 0 and d.tokenize_cpu_s is not None:
        out["tokenizer_threads"] = round(d.tokenize_cpu_s / d.tokenize_in_loop_s, 2)
    out["interim_workers"] = workers or None
    if workers and interim_t is not None and d.batch_s:
        out["interim_loop_speedup"] = round(d.batch_s / interim_t[0], 3)
    return out


@dataclass(frozen=True)
class StallFigures:
    """The loader's wait and the workers that shorten it: worded by ``_word_stall``."""

    d: DataWait
    diag: Diagnosis | None
    plan: WorkerPlan
    stall: list[Claim]  # the part of the loader's wait the workers give back (and the cold compute past it)
    build_unmeasured: bool  # stack samples only: the whole wait at best


class DataStall(Rule):
    name = "data_stall"
    fires_when = f'the loop waits ≥ {_WAIT} of wall for batches, not explained by tokenization, a waiting build or the cores'
    fix_from = "the loop model of analysis/buildcost: the fewest workers within 5% of the best loop time, from the build's measured CPU and blocked time (Little's law) and the cores the run can have; else ⌈1.25 × build time ÷ compute⌉ capped by free cores"

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None:
            return None
        diag = d.diagnose()
        if diag is not None and diag.kind != "data_stall":
            return None
        if diag is None and (d.io_dominated or d.cpu_saturated):
            return None
        if d.residual_s / d.wall_s < MIN_SHARE:
            return None
        plan = worker_plan(d)
        predicted = plan.predicted
        if predicted is not None and d.batch_s:
            # Seconds per batch the workers give back, taken from the loader's part of the wait.
            low_s, high_s = (d.n_batches * (d.batch_s - t) for t in predicted)
            stall = d.ready_claims(low_s, up_to_s=high_s)
        elif d.load_s_per_batch is None:
            # Batch build cost unknown (stack samples only): the whole wait at best, say so.
            stall = [d.residual_claim(0.0, up_to_s=d.residual_s)]
        else:  # measured, and no worker count helps: the wait is still the loop's, all of it
            stall = [d.residual_claim(d.residual_s)]
        unmeasured = not (predicted is not None and d.batch_s) and d.load_s_per_batch is None
        # where the tokenizer is most of the build, pre-tokenizing (tokenization_in_loop's fix, with
        # its caching switch where the script has one) is the cache: the workers take the rest
        cache = None if d.tokenizer_leads else _cache_figures(a, d, diag, plan)
        if cache is not None:
            return _word_cache(cache)
        return _word_stall(StallFigures(d, diag, plan, stall, unmeasured))


@dataclass(frozen=True)
class CacheFigures:
    """Each item computed once, before training, beside the workers: worded by ``_word_cache``."""

    d: DataWait
    diag: Diagnosis
    plan: WorkerPlan  # the workers, the alternative for items that change each epoch
    items: int  # the dataset's length: what the cache holds
    speedup: float  # per batch, the build gone from the loop
    workers_speedup: float | None  # per batch, with the plan's workers


def _cache_figures(a: Analysis, d: DataWait, diag: Diagnosis | None, plan: WorkerPlan) -> CacheFigures | None:
    """Pre-computing the items, when it beats the workers: a build that computes (not one that
    waits on storage: io_bound's), of a dataset with a length (an iterable one cannot be indexed
    once), and a loop that then runs at its compute. Workers on the cores the compute also uses
    often give less than their model says (#40 item 3); a cache takes no core during training."""
    loader = a.primary.loaders[0] if a.primary is not None and a.primary.loaders else None
    items = loader.get("dataset_len") if loader is not None else None
    if diag is None or d.build is None or d.build.kind == "wait" or not isinstance(items, int) or items < 1:
        return None
    m = diag.model
    speedup = m.speedup(m.compute_alone_s) if m.compute_alone_s > 0 else 0.0  # its claims' figure
    workers = m.speedup(plan.predicted[0]) if plan.predicted is not None and plan.workers else None
    if speedup < BETTER or (workers is not None and speedup < BETTER * workers):
        return None
    return CacheFigures(d, diag, plan, items, speedup, workers)


def _word_cache(fig: CacheFigures) -> Finding:
    d, plan = fig.d, fig.plan
    alt = worker_words(d, plan) if plan.workers else None
    summary = (f"Compute each of the {fig.items} items once before training and load them from memory or "
               f"disk, if an item is the same every epoch (no random augmentation): the batch build "
               f"({d.build.describe() if d.build else 'measured'}) leaves the loop, about {_gain(fig.speedup)} "
               "faster per batch.")
    if alt is not None and fig.workers_speedup is not None:
        summary += f" If items change each epoch: {_with_values(alt.summary, plan.config)}"
    snippet = ("# once, before training (items that are the same every epoch):\n"
               "cached = [dataset[i] for i in range(len(dataset))]  # or ds.map(...).save_to_disk(...)\n"
               "loader = DataLoader(cached, batch_size=batch_size, shuffle=True, collate_fn=collate_fn)")
    return Finding(
        rule=DataStall.name,
        title="The training loop waits for data",
        # the whole build goes, its tokenizer calls too, where tokenization_in_loop fires as well:
        # one knob, one figure (its claims settle to the model's ``fig.speedup``; the report's total
        # compounds the two findings' claims on data_wait, never past the bucket)
        claims=d.whole_build_claims(),
        evidence=_wait_evidence(d),
        fix=Fix(summary=summary, snippet=snippet, library=d.names.library, call=d.names.call),
        data={
            **d.stall_data(),
            "dataset_items": fig.items,
            "predicted_loop_speedup_cached": round(fig.speedup, 3),
            "recommended_workers": plan.workers,
            **_alone_data(d, fig.diag),
            PRECOMPUTE: "cache",
            **({"alternative": plan.config} if plan.config else {}),
        },
    )


def _word_stall(fig: StallFigures) -> Finding:
    d = fig.d
    fix = worker_words(d, fig.plan)
    if fig.build_unmeasured:
        fix.summary += " (batch build cost not measured here: run under hooks for an exact worker count)"
    return Finding(
        rule=DataStall.name,
        title="The training loop waits for data",
        claims=fig.stall,
        evidence=_wait_evidence(d),
        fix=fix,
        data={
            **d.stall_data(),
            "recommended_workers": fig.plan.workers,
            **_alone_data(d, fig.diag),
        },
    )


STORAGE = ("Copy the dataset to local NVMe and store it as Arrow (save_to_disk / load_from_disk, "
           "memory-mapped) instead of many small files on network storage.")


@dataclass(frozen=True)
class IoFigures:
    """A build that waits (storage, network) and the workers or storage that fix it: worded by ``_word_io``."""

    d: DataWait
    diag: Diagnosis | None  # None: the build's CPU was not timed; the host's iowait decided
    waste: float  # the loader's wait, of wall time
    read_mib_s: float | None
    plan: WorkerPlan | None  # with a diagnosis: workers by Little's law
    workers: int  # without one: workers at least 2, at most the free cores
    claims: list[Claim]


class IoBound(Rule):
    name = "io_bound"
    fires_when = (f"data wait ≥ {_WAIT} where a batch build is blocked (I/O, network, sleep) at least half its wall, "
                  f"or iowait ≥ {IOWAIT_PCT:.0f}% where the build's CPU was not measured")
    fix_from = "workers by Little's law (a blocked worker needs no core), capped by memory and the dataset; local NVMe, Arrow/memory-mapped storage"

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None:
            return None
        diag = d.diagnose()
        if diag is not None:
            if diag.kind != "io_bound":
                return None
        elif not d.io_dominated:
            return None
        waste = d.residual_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        if diag is None:
            return _word_io(IoFigures(d, None, waste, a.host.read_mib_s, None, max(2, d.free_cores),
                                      [d.residual_claim(d.residual_s)]))
        plan = worker_plan(d)
        predicted = plan.predicted
        removed = d.n_batches * (d.batch_s - predicted[0]) if predicted and d.batch_s else d.residual_s
        # A measured wait is never 0% waste: what the workers leave is still the storage's.
        claims = d.ready_claims(removed, up_to_s=max(removed, d.residual_s))
        return _word_io(IoFigures(d, diag, waste, a.host.read_mib_s, plan, plan.workers, claims))


def _word_io(fig: IoFigures) -> Finding:
    d, read = fig.d, fig.read_mib_s
    if fig.plan is None:
        config = {d.names.loader_key("dataloader_num_workers", "num_workers"): fig.workers}
        fix = Fix(summary=STORAGE,
                  config={k: v for k, v in config.items() if v != d.num_workers},  # never the value that ran
                  snippet="# copy once: cp -r /mnt/shared/data /local_nvme/data\n"
                  "ds = datasets.load_from_disk('/local_nvme/data')",
                  library=d.names.library, call=d.names.call)
        evidence = (
            f"The loop waited {d.wait_s:.1f} s for batches ({pct(fig.waste)} of wall) while the CPU spent "
            f"{d.iowait_pct:.0f}% of its time in iowait"
            + (f" and the run read {read:.1f} MiB/s" if read is not None else "")
            + "."
        )
    else:
        fix = worker_words(d, fig.plan)
        fix.summary += f" Then, or if the build still waits: {STORAGE[0].lower()}{STORAGE[1:]}"
        evidence = _wait_evidence(d) + " A worker blocked on I/O needs no core: the count is not capped by cores."
    return Finding(
        rule=IoBound.name,
        title="Building a batch mostly waits (storage, network), not computes",
        claims=fig.claims,
        evidence=evidence,
        fix=fix,
        data={"iowait_pct": round(d.iowait_pct or 0.0, 1), "read_mib_s": read,
              "data_wait_s": round(d.wait_s, 3), **_alone_data(d, fig.diag)},
    )


@dataclass(frozen=True)
class CpuFigures:
    """A build short of cores, and the workers the free cores allow: worded by ``_word_cpu``."""

    d: DataWait
    diag: Diagnosis | None  # None: the host's busy cores decided
    waste: float  # the loader's wait, of wall time
    fewer: int  # workers at most the free cores
    tokenize_calls: int  # text or images: a tokenizer call says text


class CpuSaturated(Rule):
    name = "cpu_saturated"
    fires_when = (f"data wait ≥ {_WAIT} where the batch build computes and no worker count beats what ran on the "
                  f"cores the run can have (every core ≥ {CPU_SATURATED_PCT:.0f}% busy where the build's CPU was not "
                  "measured), and the tokenizer is not most of the build (then tokenization_in_loop's finding is the one)")
    fix_from = '*no* extra workers: move the work offline or get more CPU per GPU; the other programs holding cores are named, with the host-alone figure'

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None:
            return None
        diag = d.diagnose()
        if diag is not None:
            if diag.kind != "cpu_saturated":
                return None
        elif not d.cpu_saturated or d.io_dominated:
            return None
        if d.tokenizer_leads:
            # One knob, one finding: the offline step for the rest of the build is the one
            # tokenization_in_loop prescribes (its words say no core is free for workers), and where
            # the script's switch caches whole items, it claims the whole build with its one figure.
            # Named here too, the same switch read 4.00x there and 1.33x here.
            return None
        waste = d.residual_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        fewer = min(d.num_workers or 0, d.free_cores)
        return _word_cpu(CpuFigures(d, diag, waste, fewer, a.primary.tokenize_calls if a.primary else 0))


def _word_cpu(fig: CpuFigures) -> Finding:
    d, diag = fig.d, fig.diag
    key = d.names.loader_key("dataloader_num_workers", "num_workers")
    config = {key: fig.fewer} if fig.fewer != (d.num_workers or 0) and diag is None else {}  # never the value that ran
    words = vocabulary.cpu_work_words(d.names, fig.tokenize_calls, d.cores, fig.fewer)
    summary = words["summary"]  # text or images, in the pipeline's own terms (rules/vocabulary.py)
    others = others_words(d)
    if diag is not None and others:
        if diag.alone is not None:
            summary += (f" The cores this run could use are held by {others}: on the host alone "
                        f"{plural(diag.alone[0], 'worker')} would give {_gain(diag.model.speedup(diag.alone[1]))}.")
        else:
            summary += f" ({others}; alone, no worker count would do better either.)"
    evidence = (
        f"The machine's {d.cores} cores were {d.cpu_total_pct or 0.0:.0f}% busy during training and the loop "
        f"waited {d.wait_s:.1f} s for batches ({pct(fig.waste)} of wall). Adding workers would only "
        "compete for the same cores."
    ) if diag is None else _wait_evidence(d) + " No worker count beats what ran on the cores the run can have."
    return Finding(
        rule=CpuSaturated.name,
        title="The batch build needs more CPU than the run can have; the loop waits for data",
        # the fix moves the build offline (PRECOMPUTE "cache"): data_stall's cache, one model for the
        # one knob: the whole build goes, its tokenizer calls too, and the compute runs back to back
        # (where the tokenizer is most of it, tokenization_in_loop's finding is the one: see match)
        claims=d.whole_build_claims(),
        evidence=evidence,
        fix=Fix(
            summary=summary,
            config=config,
            snippet=words["snippet"],
            library=d.names.library,
            call=d.names.call,
        ),
        data={"cpu_total_pct": round(d.cpu_total_pct or 0.0, 1), "cores": d.cores, **_alone_data(d, diag),
              PRECOMPUTE: "cache"},
    )
