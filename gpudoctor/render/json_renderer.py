"""``report.json``: the report dict as stable, indented, strict JSON.

Key order and finding order are kept as given (the analysis already sorts
findings). NaN and infinities are not JSON; they become ``null``, which the
schema reads as "could not be observed".
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

from gpudoctor.core.schema import Report
from gpudoctor.render.base import Renderer


def sanitize(obj: Any) -> Any:
    """A copy of ``obj`` made of JSON types only, with non-finite floats as None."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return str(obj)


def dumps(obj: Any) -> str:
    """Indented JSON text of ``obj`` that every strict parser accepts."""
    return json.dumps(sanitize(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


class JsonRenderer(Renderer):
    """Renders ``report.json``."""

    output_file_extension = "json"

    def render(self, report: Report) -> str:
        return dumps(report)
