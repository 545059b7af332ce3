"""A batch's row lengths, bounded: a sample of at most :data:`MAX_BATCH_LENGTHS` plus exact figures.

A ``batch`` event once held every row's non-pad length: a 1 M-row batch wrote a 2 MB line per
step, and a reader held them all (50 such lines took 2.25 GB). Both sides now keep an evenly
spaced sample of the lengths (what the percentiles read) beside the exact ``rows`` and
``lengths_max`` (what the padding fixes are sized from); the exact sum is ``tokens - pad``.
The hooks write it this way (:mod:`gpudoctor.hooks.torch_hooks`), and the reader bounds an
older or forged line the same way (:mod:`gpudoctor.recording.read`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_BATCH_LENGTHS = 1024


def sample(lengths: list[Any], limit: int = MAX_BATCH_LENGTHS) -> list[Any]:
    """At most ``limit`` evenly spaced items of ``lengths`` (all of them when there are fewer)."""
    n = len(lengths)
    if n <= limit:
        return lengths
    return [lengths[i * n // limit] for i in range(limit)]


def bound(event: dict[str, Any], limit: int = MAX_BATCH_LENGTHS) -> dict[str, Any]:
    """``event`` (a ``batch`` line) with its ``lengths`` sampled down to ``limit``; ``rows`` and
    ``lengths_max`` hold the exact figures of the full list (kept when the line has them already)."""
    lengths = event.get("lengths")
    if type(lengths) is not list or len(lengths) <= limit:
        return event
    if "rows" not in event:
        event["rows"] = len(lengths)
    if "lengths_max" not in event:
        try:
            event["lengths_max"] = max(lengths)
        except TypeError:  # mixed types: the validator refuses the line anyway
            event["lengths_max"] = None
    event["lengths"] = sample(lengths, limit)
    return event


def rows(batch: Mapping[str, Any]) -> int:
    """Rows in the batch: exact even when ``lengths`` is a sample."""
    n = batch.get("rows")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else len(batch.get("lengths") or [])


def longest(batch: Mapping[str, Any]) -> int | None:
    """The batch's longest row (exact), or None when no lengths were recorded."""
    top = batch.get("lengths_max")
    if isinstance(top, int) and not isinstance(top, bool):
        return top
    lengths = batch.get("lengths") or []
    return max(lengths) if lengths else None


def padded_width(top: int, multiple: int) -> int:
    """``top`` rounded up to a whole ``multiple``: a batch padded to its longest row, or a cap set
    to a length, at the pad multiple (1: exactly)."""
    return -(-int(top) // multiple) * multiple
