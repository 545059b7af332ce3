"""A figure read from a report or a recording, as a number (or a date) or None.

Below the analysis, the diff and the renderers alike: each reads ``null``, NaN, a string or a
bool where a number belongs the same way (as missing), so none computes with what is not one.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any


def num(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, NaN, inf, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def iso_utc(epoch_s: Any) -> str | None:
    """Epoch seconds as ISO 8601 in UTC, or None where no calendar date holds them (a torn or
    hand-edited meta's ``-1e12`` or ``1e300``: the report says the time is unknown, it never raises)."""
    t = num(epoch_s)
    if t is None:
        return None
    try:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):
        return None
