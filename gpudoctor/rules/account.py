"""One account of time: what every fix gives back, in seconds of the breakdown's buckets.

A finding does not state its own waste. It *claims* part of one or more buckets
of the disjoint breakdown (startup, data_wait, compute, checkpoint, eval, other),
and this module settles all claims together, so that:

* a claim never exceeds its bucket, and no second is counted twice;
* claims on *disjoint parts* of a bucket add (tokenizer time and the rest of the
  data wait are different seconds);
* claims on the *same* seconds compound: TF32 and bf16 both speed up the matmuls
  the GPU is busy with, so together they remove ``1 - (1 - a)(1 - b)`` of them,
  never ``a + b``.

Each finding's ``waste_fraction`` is its claims settled alone; the report's
``wasted_fraction`` (and the verdict's speedup) is every claim settled together.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

from gpudoctor.core import schema

BUCKETS: tuple[schema.Bucket, ...] = get_args(schema.Bucket)  # one list: the schema's
WHOLE = ""  # the part name of a claim on the whole bucket
# The training loop's buckets: steady-state steps/s is made of these (startup and teardown are not).
LOOP_BUCKETS: tuple[schema.Bucket, ...] = ("data_wait", "compute", "communication", "checkpoint", "eval")
MAX_WASTED = 0.99  # some compute always remains: a 100x claim is a bug, not a prediction
SETTLED_ONLY = frozenset({"up_to"})  # fields of Claim not written to the report


@dataclass(frozen=True)
class Claim:
    """A fix removes ``fraction`` of ``part`` of ``bucket``.

    ``part`` names a disjoint piece of the bucket (e.g. ``"tokenize"`` of ``data_wait``,
    ``"gpu_idle"`` of ``compute``) that makes up ``part_share`` of it; claims on
    different parts add, claims on one part compound. A claim on the whole bucket
    (``part=""``) compounds with whatever the parts left.

    The report's claim (:class:`gpudoctor.core.schema.Claim`) has the same fields, less
    :data:`SETTLED_ONLY` (``up_to`` settles the finding's optimistic speedup; it is not written).
    """

    bucket: schema.Bucket
    fraction: float  # the conservative figure: what the measurement supports for sure
    part: str = WHOLE
    part_share: float = 1.0
    up_to: float | None = None  # the optimistic figure, when the gain depends on what was not measured

    def to_dict(self) -> schema.Claim:
        """The report's claim (:class:`gpudoctor.core.schema.Claim`), rounded."""
        return {"bucket": self.bucket, "part": self.part or None,
                "part_share": round(self.part_share, 4), "fraction": round(self.fraction, 4)}

    def optimistic(self) -> Claim:
        return Claim(self.bucket, max(self.fraction, self.up_to or 0.0), self.part, self.part_share)

    def __post_init__(self) -> None:
        if self.bucket not in BUCKETS:
            raise ValueError(f"unknown breakdown bucket {self.bucket!r}")


def claim(bucket: schema.Bucket, removed_s: float, bucket_s: float, part: str = WHOLE,
          part_s: float | None = None, up_to_s: float | None = None) -> Claim:
    """A claim from seconds: ``removed_s`` (at best ``up_to_s``) out of ``part_s`` (default:
    the whole ``bucket_s``)."""
    of_s = bucket_s if part_s is None else part_s
    fraction = _unit(removed_s / of_s) if of_s > 0 else 0.0
    up_to = _unit(up_to_s / of_s) if up_to_s is not None and of_s > 0 else None
    share = _unit(part_s / bucket_s) if part_s is not None and bucket_s > 0 else 1.0
    return Claim(bucket, fraction, part, share if part else 1.0, up_to if up_to != fraction else None)


def removed_of_bucket(claims: Iterable[Claim]) -> float:
    """The share (0..1) of one bucket that ``claims`` (all on that bucket) remove together."""
    kept: dict[str, float] = defaultdict(lambda: 1.0)  # per part: what survives every claim on it
    shares: dict[str, float] = {}
    for c in claims:
        kept[c.part] *= 1.0 - _unit(c.fraction)
        shares[c.part] = max(shares.get(c.part, 0.0), _unit(c.part_share))
    parts = [p for p in kept if p != WHOLE]
    scale = min(1.0, 1.0 / s) if (s := sum(shares[p] for p in parts)) > 0 else 1.0  # parts are disjoint
    removed_parts = sum(shares[p] * scale * (1.0 - kept[p]) for p in parts)
    left = (1.0 - removed_parts) * kept.get(WHOLE, 1.0)
    return _unit(1.0 - left)


def settle(bucket_shares: Mapping[str, float | None], claims: Iterable[Claim]) -> dict[str, float]:
    """Share of wall time removed from each bucket when every claim is applied together."""
    by_bucket: dict[str, list[Claim]] = defaultdict(list)
    for c in claims:
        by_bucket[c.bucket].append(c)
    return {b: (bucket_shares.get(b) or 0.0) * removed_of_bucket(cs) for b, cs in by_bucket.items()}


def wasted_share(bucket_shares: Mapping[str, float | None], claims: Iterable[Claim]) -> float:
    """Share of wall time the claims give back together: never above the buckets they touch."""
    return _unit(sum(settle(bucket_shares, claims).values()))


def loop_shares(bucket_shares: Mapping[str, float | None]) -> dict[str, float] | None:
    """Each loop bucket's share of the training loop (None: no loop measured): the shares a fix's
    steady-state speedup is settled on, as ``try`` measures it and a long run gets it."""
    loop = sum(bucket_shares.get(b) or 0.0 for b in LOOP_BUCKETS)
    if loop <= 0:
        return None
    return {b: (bucket_shares.get(b) or 0.0) / loop for b in LOOP_BUCKETS}


def steady_speedup(bucket_shares: Mapping[str, float | None], claims: Iterable[Claim]) -> float | None:
    """The one predicted speedup: steady-state steps/s after the fix over before, from the claims
    on the loop's buckets (a claim on startup alone changes no step: None)."""
    loop = loop_shares(bucket_shares)
    kept = [c for c in claims if c.bucket in LOOP_BUCKETS]
    return speedup(wasted_share(loop, kept)) if loop is not None and kept else None


def speedup(wasted: float) -> float | None:
    """Removing a share ``w`` of wall time makes the run ``1 / (1 - w)`` times faster."""
    if wasted <= 0:
        return None
    return 1.0 / (1.0 - min(wasted, MAX_WASTED))


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x)) if math.isfinite(x) else 0.0
