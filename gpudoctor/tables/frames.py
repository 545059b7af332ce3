"""Rows to typed pandas DataFrames; pandas is optional, imported only here and only when asked.

pandas, not a table class of our own: it is what a notebook already holds, and its nullable
types (``Int64``, ``boolean``, ``string``) keep a missing figure missing through parquet.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.tables.columns import COLUMNS

_ORDER = {"samples": ["t_s", "source", "gpu"], "events": ["start_s", "pid"], "steps": ["training", "rank", "step"],
          "breakdown": ["training", "rank", "pid"]}


def pandas() -> Any:
    """The pandas module, or one line saying how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise UserError("the tables need pandas, which is not installed; pip install 'gpudoctor[pandas]'") from None
    return pd


def frame(name: str, rows: list[dict[str, Any]]) -> Any:
    """``rows`` as the DataFrame of table ``name``: its columns, in order, with their types."""
    pd = pandas()
    columns = COLUMNS[name]
    df = pd.DataFrame({c: pd.Series([r.get(c) for r in rows], dtype=dtype) for c, dtype in columns.items()})
    return df.sort_values(_ORDER[name], kind="stable", ignore_index=True) if len(df) else df
