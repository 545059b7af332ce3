"""Rules about the input pipeline: why the loop waits for batches, and what fixes it.

A data wait has one cause at a time, and each rule claims only its own part so
the wastes never double count: tokenizer time on the training process goes to
``tokenization_in_loop``; what remains goes to ``io_bound`` when the disk is
the limit, ``cpu_saturated`` when no core is free, else ``data_stall`` (too
few workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.common.wording import plural
from gpudoctor.rules import values, vocabulary
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import Finding, Fix, Rule, Table, pct
from gpudoctor.rules.names import Names, names_for

MIN_SHARE = 0.05
IOWAIT_PCT = 20.0
CPU_SATURATED_PCT = 90.0


@dataclass
class DataWait:
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

    @property
    def residual_s(self) -> float:
        return max(0.0, self.wait_s - self.tokenize_in_wait_s)

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
    )


def _tokenizes_in_main(names: Names) -> bool:
    # With workers, the main process's tokenizer calls are not what it waits on.
    workers = names.current("dataloader_num_workers", "num_workers")
    return not workers


def worker_fix(d: DataWait) -> tuple[int, Fix, tuple[float, float] | None]:
    """Recommend a worker count from measured load cost vs step compute and free cores.

    Returns (workers, fix, (slowest, fastest) predicted loop time per batch with them).
    """
    names = d.names
    needed = d.workers_needed() or 2
    workers = values.workers_for(needed, d.free_cores)
    wanted = {("dataloader_num_workers", "num_workers"): workers}
    if workers:
        wanted |= {("dataloader_persistent_workers", "persistent_workers"): True,
                   ("dataloader_prefetch_factor", "prefetch_factor"): 2}
    # A Trainer builds its DataLoader itself: only the TrainingArguments fields it has can be set.
    cfg: dict[str, object] = {
        (field if names.is_trainer else arg): value
        for (field, arg), value in wanted.items()
        if not names.is_trainer or names.has(field)
    }
    predicted = d.worker_batch_s(workers)
    if names.is_trainer:
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        snippet = f"TrainingArguments(..., {args})"
    else:
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        snippet = f"DataLoader(dataset, batch_size=..., {args})"
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
        else f"No core is free for DataLoader workers ({d.cores} cores{busy}); move the per-batch work offline."
    )
    return workers, Fix(summary=summary, config=cfg, snippet=snippet, library=names.library, call=names.call), predicted


class TokenizationInLoop(Rule):
    name = "tokenization_in_loop"
    fires_when = 'the training process tokenizes ≥ 5% of wall after the first step'
    fix_from = 'pre-tokenize offline (gives back the measured tokenizer seconds); meanwhile workers, sized as for `data_stall`'

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None:
            return None
        waste = d.tokenize_in_loop_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        _, interim, _ = worker_fix(d)
        pad = a.padding()
        multiple = values.pad_multiple_for(pad.get("p50_length"))
        max_len = values.max_length_for(pad.get("p99_length"), pad.get("max_length"), multiple=multiple)
        truncate = f", max_length={max_len}" if max_len else ""
        snippet = (
            "# once, on a CPU machine, before renting GPUs:\n"
            f"ds = ds.map(lambda b: tokenizer(b['text'], truncation=True{truncate}),\n"
            f"            batched=True, num_proc={max(1, d.cores)}, remove_columns=['text'])\n"
            "ds.save_to_disk('data/tokenized')\n"
            "# in the training script:\n"
            "ds = datasets.load_from_disk('data/tokenized')\n"
            f"collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of={multiple})"
        )
        return Finding(
            rule=self.name,
            title="Tokenizing inside the training loop",
            # Pre-tokenized data removes the tokenizer's part of the wait; time it spent outside a
            # wait (after a batch arrived) is in compute.
            claims=[claim("data_wait", d.tokenize_in_wait_s, d.wait_s, part="tokenize", part_s=d.tokenize_in_wait_s),
                    claim("compute", d.tokenize_in_loop_s - d.tokenize_in_wait_s, d.compute_s)],
            evidence=(
                f"{d.tokenize_in_loop_s:.1f} s of tokenizer calls on the training process after the first step "
                f"({pct(waste)} of wall time), while the loop waited {d.wait_s:.1f} s for batches "
                f"with {plural(d.num_workers or 0, 'DataLoader worker')}."
            ),
            fix=Fix(
                summary=f"Pre-tokenize once with datasets.map(batched=True, num_proc={max(1, d.cores)}) and "
                f"save_to_disk: that gives back the {d.tokenize_in_loop_s:.1f} s of tokenizing (the predicted "
                f"speedup). Until then, {interim.summary[0].lower()}{interim.summary[1:]}",
                config=interim.config,
                snippet=snippet,
                library=d.names.library,
                call=d.names.call,
                also=[Table("datasets.Dataset.map", "ds.map", {"batched": True, "num_proc": max(1, d.cores)})],
            ),
            data={"tokenize_in_loop_s": round(d.tokenize_in_loop_s, 3), "data_wait_s": round(d.wait_s, 3)},
        )


class DataStall(Rule):
    name = "data_stall"
    fires_when = 'the loop waits ≥ 5% of wall for batches, not explained by tokenization, disk or busy CPU'
    fix_from = "workers = ⌈1.25 × measured batch build time ÷ compute per batch⌉, capped by the cores the training processes and other programs leave free; speedup from a model of those cores (a range where a batch build's threads were not measured)"

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None or d.io_dominated or d.cpu_saturated:
            return None
        share = d.residual_s / d.wall_s
        if share < MIN_SHARE:
            return None
        workers, fix, predicted = worker_fix(d)
        if predicted is not None and d.batch_s:
            # Seconds per batch the workers give back, taken from the loader's part of the wait.
            low_s, high_s = (d.n_batches * (d.batch_s - t) for t in predicted)
            stall = d.residual_claim(min(d.residual_s, low_s), up_to_s=min(d.residual_s, high_s))
        else:
            # Batch build cost unknown (stack samples only): the whole wait at best, say so.
            stall = d.residual_claim(0.0, up_to_s=d.residual_s)
            fix.summary += " (batch build cost not measured here: run under hooks for an exact worker count)"
        per_batch = d.wait_s / max(d.n_batches, 1)
        evidence = (
            f"The loop waited {d.wait_s:.1f} s for batches ({pct(d.wait_s / d.wall_s)} of wall), "
            f"{1000 * per_batch:.0f} ms per batch with {plural(d.num_workers or 0, 'worker')}; "
        )
        if d.load_s_per_batch is not None and d.compute_s_per_batch is not None:
            evidence += (
                f"building a batch costs {1000 * d.load_s_per_batch:.0f} ms against "
                f"{1000 * d.compute_s_per_batch:.0f} ms of compute per batch."
            )
        return Finding(
            rule=self.name,
            title="The training loop waits for data",
            claims=[stall],
            evidence=evidence,
            fix=fix,
            data={
                "data_wait_s": round(d.wait_s, 3),
                "load_ms_per_batch": round(1000 * d.load_s_per_batch, 2) if d.load_s_per_batch else None,
                "compute_ms_per_batch": round(1000 * d.compute_s_per_batch, 2) if d.compute_s_per_batch else None,
                "cores": d.cores,
                "free_cores": d.free_cores,
                "recommended_workers": workers,
            },
        )


class IoBound(Rule):
    name = "io_bound"
    fires_when = 'data wait with iowait ≥ 20%'
    fix_from = 'local NVMe, Arrow/memory-mapped storage'

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None or not d.io_dominated:
            return None
        waste = d.residual_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        read = a.host.read_mib_s
        return Finding(
            rule=self.name,
            title="Reading the data is the bottleneck",
            claims=[d.residual_claim(d.residual_s)],
            evidence=(
                f"The loop waited {d.wait_s:.1f} s for batches ({pct(waste)} of wall) while the CPU spent "
                f"{d.iowait_pct:.0f}% of its time in iowait"
                + (f" and the run read {read:.1f} MiB/s" if read is not None else "")
                + "."
            ),
            fix=Fix(
                summary="Copy the dataset to local NVMe and store it as Arrow (save_to_disk / load_from_disk, "
                "memory-mapped) instead of many small files on network storage.",
                config={d.names.loader_key("dataloader_num_workers", "num_workers"): max(2, d.free_cores)},
                snippet="# copy once: cp -r /mnt/shared/data /local_nvme/data\n"
                "ds = datasets.load_from_disk('/local_nvme/data')",
                library=d.names.library,
                call=d.names.call,
            ),
            data={"iowait_pct": round(d.iowait_pct or 0.0, 1), "read_mib_s": read},
        )


class CpuSaturated(Rule):
    name = "cpu_saturated"
    fires_when = 'data wait with every core busy (≥ 90%)'
    fix_from = '*no* extra workers: move the work offline or get more CPU per GPU'

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None or not d.cpu_saturated or d.io_dominated:
            return None
        waste = d.residual_s / d.wall_s
        if waste < MIN_SHARE:
            return None
        return Finding(
            rule=self.name,
            title="All CPU cores are busy; the loop still waits for data",
            claims=[d.residual_claim(d.residual_s)],
            evidence=(
                f"The machine's {d.cores} cores were {d.cpu_total_pct:.0f}% busy during training and the loop "
                f"waited {d.wait_s:.1f} s for batches ({pct(waste)} of wall). Adding workers would only "
                "compete for the same cores."
            ),
            fix=Fix(
                **vocabulary.cpu_work_words(d.names, a.primary.tokenize_calls if a.primary else 0, d.cores,
                                            min(d.num_workers or 0, d.free_cores)),
                config={d.names.loader_key("dataloader_num_workers", "num_workers"): min(d.num_workers or 0, d.free_cores)},
                library=d.names.library,
                call=d.names.call,
            ),
            data={"cpu_total_pct": round(d.cpu_total_pct or 0.0, 1), "cores": d.cores},
        )
