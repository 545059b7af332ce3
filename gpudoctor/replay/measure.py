"""Measurements only the worker can take, for preflight: how fast one process
produces batches, what the startup work costs per example, token lengths, and
what a checkpoint costs. Written as ``replay_measure.json`` in the run folder.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from gpudoctor.replay.build import Pipeline
from gpudoctor.replay.costmodel import padded_lengths
from gpudoctor.replay.data import Collator, ReplayDataset, Stages
from gpudoctor.rules import values as _values

SCHEMA = "gpudoctor.replay_measure/1"
LENGTH_SAMPLE = 4000


def percentile(values: list[float], q: float) -> float:
    """Percentile (``q`` in 0..100) of a non-empty list, as the rules compute it (values.py)."""
    return float(_values.percentile(values, q) or 0.0)


def _indices(n: int, count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(n) for _ in range(count)]


def time_batches(
    dataset: Any, collate: Any, batch_size: int, batches: int, budget_s: float, after: Any = None
) -> dict[str, Any]:
    """Seconds per sample to produce ``batches`` batches in this one process.

    Stops early after ``budget_s``; ``after`` (the loop's own work) is timed apart.
    """
    index = _indices(len(dataset), batches * batch_size)
    produce_s = loop_s = 0.0
    done = 0
    start = time.perf_counter()
    for b in range(batches):
        t0 = time.perf_counter()
        batch = collate([dataset[i] for i in index[b * batch_size : (b + 1) * batch_size]])
        t1 = time.perf_counter()
        if after is not None:
            after(batch)
        produce_s += t1 - t0
        loop_s += time.perf_counter() - t1
        done += batch_size
        if time.perf_counter() - start > budget_s:
            break
    return {
        "samples": done,
        "s_per_sample": produce_s / done,
        "loop_s_per_sample": loop_s / done if after is not None else 0.0,
    }


def measure_pipeline(
    pipe: Pipeline, batch_size: int, batches: int, budget_s: float
) -> dict[str, Any]:
    """Capacity of the configured Dataset+collate on one process, and of a pre-tokenized one."""
    as_configured = time_batches(
        pipe.dataset, pipe.collator, batch_size, batches, budget_s, pipe.loop_work
    )
    pretok = _pretokenized(pipe, batch_size, batches, budget_s)
    return {
        "batch_size": batch_size,
        "samples_timed": as_configured["samples"],
        "loader_s_per_sample": as_configured["s_per_sample"],
        "samples_per_s": 1.0 / as_configured["s_per_sample"],
        "loop_s_per_sample": as_configured["loop_s_per_sample"],
        "pretokenized_s_per_sample": pretok,
        "stages": {"format_at": pipe.stages.fmt, "tokenize_at": pipe.stages.tok},
    }


def _pretokenized(pipe: Pipeline, batch_size: int, batches: int, budget_s: float) -> float:
    """Seconds per sample when token ids are read from Arrow and only padded (the fix)."""
    import datasets

    if pipe.stages.tok in ("ahead", "startup"):
        sample = time_batches(pipe.dataset, pipe.collator, batch_size, batches, budget_s)
        return float(sample["s_per_sample"])
    n = min(len(pipe.dataset.data), batch_size * batches)
    rows = [pipe.dataset.data[i] for i in range(n)]
    ahead = Stages("ahead", "ahead")
    formatted = pipe.stages.fmt in ("ahead", "startup")
    ids = pipe.ops.tokenize([r["text"] if formatted else pipe.ops.format(r) for r in rows])
    data = datasets.Dataset.from_dict({"input_ids": ids})
    sample = time_batches(
        ReplayDataset(data, pipe.ops, ahead, pipe.dataset.read_latency_s),
        Collator(pipe.ops, ahead),
        batch_size,
        batches,
        budget_s,
    )
    return float(sample["s_per_sample"])


def token_stats(
    raw_lengths: list[int], max_length: int, padding: str, batch_size: int
) -> dict[str, Any]:
    """Non-pad and padded tokens per sample for this config, and a sample of raw lengths."""
    raw = [float(x) for x in raw_lengths] or [0.0]
    if padding == "packing":  # every chunk is max_length real tokens
        nonpad = padded = [float(max_length)]
    else:
        nonpad = [min(x, max_length) for x in raw]
        padded = (
            [float(max_length)] * len(nonpad)
            if padding == "max_length"
            else padded_lengths(nonpad, batch_size)
        )
    nonpad_mean, padded_mean = statistics.fmean(nonpad), statistics.fmean(padded)
    sample = list(raw_lengths)
    if len(sample) > LENGTH_SAMPLE:
        sample = random.Random(0).sample(sample, LENGTH_SAMPLE)
    return {
        "raw_mean": statistics.fmean(raw),
        "raw_p50": percentile(raw, 50),
        "raw_p99": percentile(raw, 99),
        "raw_max": max(raw),
        "truncated_fraction": 0.0
        if padding == "packing"
        else sum(x > max_length for x in raw) / len(raw),
        "nonpad_mean": nonpad_mean,
        "nonpad_p99": percentile(nonpad, 99),
        "padded_mean": padded_mean,
        "padded_p99": percentile(padded, 99),
        "pad_fraction": 1.0 - nonpad_mean / padded_mean if padded_mean else 0.0,
        "max_length": max_length,
        "padding": padding,
        "raw_lengths_sample": sample,
    }


def checkpoint_once(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> tuple[float, int]:
    """``torch.save`` model and optimizer state as a plain loop would; return (seconds, bytes)."""
    path = folder / "checkpoint.pt"
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    seconds = time.perf_counter() - t0
    return seconds, os.path.getsize(path)
