"""The one fix engine: every value a fix sets, computed one way for the report, replay and sweep.

A recording can never show two values for one knob: the rules, replay's preflight
and the sweep call these functions and nothing else for ``save_steps``, worker
counts, ``max_length`` and the pad multiple.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpudoctor.analysis.buildcost import WORKER_HEADROOM
from gpudoctor.analysis.process import (
    percentile as percentile,  # the one percentile, for replay and sweep
)
from gpudoctor.common import batchlengths

if TYPE_CHECKING:
    from gpudoctor.analysis import Analysis

CHECKPOINT_TARGET = 0.02  # saving at most this share of wall time
PAD_MULTIPLES = (64, 32, 16, 8)  # tensor-core friendly; the largest that fits the lengths


def nice_round_up(value: float) -> int:
    """Round up to 1, 2 or 5 times a power of ten (save_steps=2000, not 1873)."""
    if value <= 1:
        return 1
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * exp >= value:
            return int(m * exp)
    return int(10 * exp)


def save_steps_for(per_save_s: float, step_s: float, target: float = CHECKPOINT_TARGET) -> int:
    """Steps between saves that keep saving under ``target`` of wall time, a round number."""
    need = per_save_s * (1 - target) / (target * max(step_s, 1e-9))
    return nice_round_up(need)


def workers_needed(load_s_per_batch: float, compute_s_per_batch: float) -> int:
    """Workers that build batches as fast as the loop eats them, with headroom."""
    return max(1, math.ceil(WORKER_HEADROOM * load_s_per_batch / max(compute_s_per_batch, 1e-9)))


def workers_for(needed: int, free_cores: int) -> int:
    """No more workers than cores the training processes leave free (0: none is free)."""
    return max(1, min(needed, free_cores)) if free_cores > 0 else 0


def pad_multiple_for(typical_length: int | None) -> int:
    """The largest tensor-core-friendly multiple that pads a typical row by at most a quarter."""
    if not typical_length:
        return PAD_MULTIPLES[-1]
    return next((m for m in PAD_MULTIPLES if 4 * m <= typical_length), PAD_MULTIPLES[-1])


def max_length_for(p99: int | None, longest_seen: int | None, configured: int | None = None,
                   multiple: int = PAD_MULTIPLES[0]) -> int | None:
    """``max_length`` that keeps 99% of rows whole: p99 rounded up to ``multiple``.

    Never below the observed p99, never above what is configured or the longest row
    padded now (the fix never lengthens a batch). None when it would not shorten anything.
    """
    if not p99:
        return None
    ceiling = min(x for x in (longest_seen, configured) if x) if (longest_seen or configured) else None
    value = batchlengths.padded_width(int(p99), multiple)
    if ceiling is not None:
        value = max(int(p99), min(value, ceiling))
        if value >= ceiling:
            return None
    return value


def batch_multiple(a: Analysis, multiple: int) -> int:
    """What each batch's width is rounded up to after a per-batch padding fix: a tensor-core
    multiple where the training computes on CUDA (aligned shapes run faster there), else 1: on a
    CPU a rounded width is only more work, and a script's own per-batch padding pads exactly."""
    cfg = a.primary.torch_cfg if a.primary is not None else None
    return multiple if cfg is not None and cfg.get("cuda") is True else 1
