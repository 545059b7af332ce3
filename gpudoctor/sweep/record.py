"""A point's trial runs as one cache record: the median over every good window,
or, when none trained steadily, the last run's failure.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpudoctor.replay.config import ReplayConfig
from gpudoctor.sweep.points import TRIAL_SCHEMA
from gpudoctor.sweep.trial import TrialRun
from gpudoctor.sweep.windows import combine


def build_record(key: str, runs: list[tuple[str, TrialRun]], cfg: ReplayConfig) -> dict[str, Any]:
    """What a point's runs add up to: the median of every good window, or the last failure."""
    good = [(name, r) for name, r in runs if r.status == "ok" and r.steady is not None]
    last_name, last = runs[-1]
    base = {
        "schema": TRIAL_SCHEMA,
        "key": key,
        "created_at": time.time(),
        "runs": [n for n, _ in runs],
    }
    if not good:
        return {**base, "status": last.status, "reason": last.reason, "metrics": None}
    tr = cfg.training
    metrics = combine(
        [r.steady for _, r in good if r.steady],
        tr.gradient_accumulation_steps,
        tr.per_device_train_batch_size,
    )
    busy = [r.gpu_busy for _, r in good if r.gpu_busy is not None]
    gpu_mem = [r.peak_gpu_mem_mib for _, r in good if r.peak_gpu_mem_mib is not None]
    metrics.update(
        gpu_busy=sum(busy) / len(busy) if busy else None,
        peak_rss_mib=max((r.peak_rss_mib or 0.0) for _, r in good) or None,
        peak_gpu_mem_mib=max(gpu_mem) if gpu_mem else None,
    )
    name, run = good[-1]
    measure = json.loads(run.measure_path.read_text()) if run.measure_path else {}
    note = None if last.status == "ok" else f"a repeat ended {last.status}: {last.reason}"
    return {
        **base,
        "status": "ok",
        "reason": note,
        "metrics": metrics,
        "device": measure.get("device"),
        "gpu_name": run.gpu_name if measure.get("device") == "cuda" else None,
        "measure_file": f"{name}/replay_measure.json" if run.measure_path else None,
    }
