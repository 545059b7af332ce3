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
from gpudoctor.rules import values
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import Finding, Fix, Rule, Table, pct, register
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
    cpu_total_pct: float | None
    iowait_pct: float | None
    names: Names

    @property
    def residual_s(self) -> float:
        return max(0.0, self.wait_s - self.tokenize_in_wait_s)

    def residual_claim(self, removed_s: float) -> Claim:
        """``removed_s`` of the wait that is not the tokenizer's (a disjoint part of data_wait)."""
        return claim("data_wait", removed_s, self.wait_s, part="loader", part_s=self.residual_s)

    @property
    def free_cores(self) -> int:
        """Cores left for DataLoader workers: each training process keeps one busy."""
        return max(0, self.cores - self.training_procs)

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
        cpu_total_pct=a.host.cpu_total_pct,
        iowait_pct=a.host.iowait_pct,
        names=names,
    )


def _tokenizes_in_main(names: Names) -> bool:
    # With workers, the main process's tokenizer calls are not what it waits on.
    workers = names.current("dataloader_num_workers", "num_workers")
    return not workers


def worker_fix(d: DataWait) -> tuple[int, Fix, float]:
    """Recommend a worker count from measured load cost vs step compute and free cores.

    Returns (workers, fix, predicted new per-batch time / old per-batch time).
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
    ratio = 1.0
    if d.load_s_per_batch and d.compute_s_per_batch and d.n_batches:
        old = d.compute_s_per_batch + d.wait_s / d.n_batches
        new = max(d.compute_s_per_batch, d.load_s_per_batch / workers) if workers else old
        ratio = min(1.0, new / old)
    if names.is_trainer:
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        snippet = f"TrainingArguments(..., {args})"
    else:
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        snippet = f"DataLoader(dataset, batch_size=..., {args})"
    limit = (
        f"; {d.cores} cores with {d.training_procs} training process(es) leave {d.free_cores} for workers"
        if needed > d.free_cores
        else ""
    )
    summary = (
        f"Load batches in {workers} background worker(s) (measured need: {needed}{limit})."
        if workers
        else f"No core is free for DataLoader workers ({d.cores} cores); move the per-batch work offline."
    )
    return workers, Fix(summary=summary, config=cfg, snippet=snippet, library=names.library, call=names.call), ratio


@register
class TokenizationInLoop(Rule):
    name = "tokenization_in_loop"
    description = "The training process tokenizes text while the loop waits for the batch."

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
                f"with {d.num_workers or 0} DataLoader worker(s)."
            ),
            fix=Fix(
                summary="Pre-tokenize once with datasets.map(batched=True, num_proc=N) and save_to_disk; "
                f"until then, {interim.summary[0].lower()}{interim.summary[1:]}",
                config=interim.config,
                snippet=snippet,
                library=d.names.library,
                call=d.names.call,
                also=[Table("datasets.Dataset.map", "ds.map", {"batched": True, "num_proc": max(1, d.cores)})],
            ),
            data={"tokenize_in_loop_s": round(d.tokenize_in_loop_s, 3), "data_wait_s": round(d.wait_s, 3)},
        )


@register
class DataStall(Rule):
    name = "data_stall"
    description = "The loop waits for batches because too few processes build them."

    def match(self, a: Analysis) -> Finding | None:
        d = data_wait(a)
        if d is None or d.io_dominated or d.cpu_saturated:
            return None
        share = d.residual_s / d.wall_s
        if share < MIN_SHARE:
            return None
        workers, fix, ratio = worker_fix(d)
        if ratio >= 1.0 and d.load_s_per_batch is None:
            # Batch build cost unknown (stack samples only): claim the whole wait, say so.
            ratio = 1.0 - share * d.wall_s / max(d.wait_s + (d.compute_s_per_batch or 0) * d.n_batches, 1e-9)
            fix.summary += " (batch build cost not measured here: run under hooks for an exact worker count)"
        loop_s = d.compute_s_per_batch * d.n_batches + d.wait_s if d.compute_s_per_batch else d.wait_s
        recovered = min(d.residual_s, loop_s * (1 - ratio)) if ratio < 1 else 0.0
        waste = recovered / d.wall_s if workers else share
        per_batch = d.wait_s / max(d.n_batches, 1)
        evidence = (
            f"The loop waited {d.wait_s:.1f} s for batches ({pct(d.wait_s / d.wall_s)} of wall), "
            f"{1000 * per_batch:.0f} ms per batch with {d.num_workers or 0} worker(s); "
        )
        if d.load_s_per_batch is not None and d.compute_s_per_batch is not None:
            evidence += (
                f"building a batch costs {1000 * d.load_s_per_batch:.0f} ms against "
                f"{1000 * d.compute_s_per_batch:.0f} ms of compute per batch."
            )
        return Finding(
            rule=self.name,
            title="The training loop waits for data",
            claims=[d.residual_claim(waste * d.wall_s)],
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


@register
class IoBound(Rule):
    name = "io_bound"
    description = "The loop waits for batches because the disk cannot deliver them."

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


@register
class CpuSaturated(Rule):
    name = "cpu_saturated"
    description = "Every core is busy, so more DataLoader workers would buy nothing."

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
                summary="Do the per-example work (tokenizing, formatting, decoding) once offline and load the "
                "result; keep workers at most the free cores, or rent a machine with more CPU per GPU.",
                config={d.names.loader_key("dataloader_num_workers", "num_workers"): min(d.num_workers or 0, d.free_cores)},
                snippet=f"ds = ds.map(preprocess, batched=True, num_proc={max(1, d.cores)})\nds.save_to_disk('data/ready')",
                library=d.names.library,
                call=d.names.call,
            ),
            data={"cpu_total_pct": round(d.cpu_total_pct or 0.0, 1), "cores": d.cores},
        )
