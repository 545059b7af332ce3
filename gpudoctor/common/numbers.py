"""A figure read from a report or a recording, as a number or None.

Below the analysis, the diff and the renderers alike: each reads ``null``, NaN, a string or a
bool where a number belongs the same way (as missing), so none computes with what is not one.
"""

from __future__ import annotations

import math
from typing import Any


def num(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, NaN, inf, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
