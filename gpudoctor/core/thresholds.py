"""The thresholds a finding fires at, each known once: the rules compare against these and write
their ``fires_when`` text (the README's rules table) from them, so the table cannot say 5% where a
rule tests 10%.

Shares are of wall time unless the name says otherwise (``_OF_STEP``).
"""

from __future__ import annotations

WASTE_SHARE = 0.05  # a wait (saving, syncs, data, startup's formatting) this share of wall time is a finding
LARGE_SHARE = 0.10  # a measured wait this large is said in the verdict even when its fix recovers little
EVAL_SHARE = 0.10  # evaluation is work the run wants: a finding only from this share of wall time
RANK_GAP = 0.10  # a rank's (or node's) wait this many points of wall above the others' median
EXPOSED_ALLREDUCE_OF_STEP = 0.10  # exposed all-reduce below this share of a step is what DDP costs anyway
REGATHER_OF_STEP = 0.05  # FSDP's backward all-gathers below this share of a step are not worth their memory
BUSY_GPU = 0.70  # busy from this share on; below it the GPU is idle (low_gpu_utilization), not slow (low_mfu)
HEADROOM_BUSY = 0.85  # a larger batch is suggested only below this busy share ...
HEADROOM_MEMORY = 0.50  # ... and below this share of the GPU's memory


def percent(share: float) -> str:
    """``0.05`` -> ``"5%"``: a threshold as the ``fires_when`` text says it."""
    return f"{round(100 * share)}%"


def points(share: float) -> str:
    """``0.10`` -> ``"10 points"``: a gap between two shares."""
    return f"{round(100 * share)} points"
