"""Write a loaded run's tables as parquet or CSV files: ``<DIR>/<table>.<ext>``, one folder per run.

Every row carries its ``run`` (the run folder's name), so a platform team can export many runs
into ``exports/<run>/`` and query ``exports/*/steps.parquet`` together (DuckDB, pandas, Spark).
Parquet keeps the column types (pyarrow writes it: the reader every one of those tools shares);
CSV writes a missing figure as an empty cell, and a text cell that a spreadsheet would read as a
formula (one starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return: a span named
``=HYPERLINK(...)``) gets a leading ``'``, as OWASP advises; number columns are written as they
are, so a negative figure stays a number. A carriage return inside a text cell is written as a
newline (quoted), so no reader splits the row there. Files are replaced by rename through the folder's
descriptor (:mod:`gpudoctor.common.safefs`), so a link planted in ``DIR`` is replaced, never written
through.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.tables import RunTables

FORMATS = ("parquet", "csv")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as a formula (OWASP)


def table_bytes(df: Any, fmt: str) -> bytes:
    """One table as the bytes of a ``fmt`` file."""
    if fmt == "csv":
        return bytes(csv_safe(df).to_csv(index=False, lineterminator="\n").encode("utf-8"))
    try:
        import pyarrow  # noqa: F401 - pandas' parquet engine, optional like pandas
    except ImportError:
        raise UserError("writing parquet needs pyarrow, which is not installed; pip install 'gpudoctor[pandas]' "
                        "or pass --format csv") from None
    buf = io.BytesIO()
    df.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


def csv_safe(df: Any) -> Any:
    """``df`` with every text cell that a spreadsheet would run as a formula prefixed by ``'``.

    Only text (object/string) columns are touched: a float or int column's ``-1.5`` is a number, not
    a formula, and stays one. The frame given is not changed.
    """
    out = df.copy()
    for name in out.columns:
        col = out[name]
        if col.dtype.kind in "biufcmM":  # numbers, booleans, times: written as they are
            continue
        out[name] = col.map(_neutralised)
    return out


def _neutralised(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if value.startswith(FORMULA_STARTS):
        value = "'" + value
    if "\r" in value:  # Python's csv (before 3.13) leaves a bare CR unquoted: a reader would split the row there
        value = value.replace("\r\n", "\n").replace("\r", "\n")  # a newline, which is quoted
    return value


def write_tables(run: RunTables, folder: Path, fmt: str = "parquet") -> list[Path]:
    """Write each of ``run``'s tables into ``folder`` (created if missing); returns the paths."""
    if fmt not in FORMATS:
        raise UserError(f"cannot export as {fmt!r}: use --format {' or '.join(FORMATS)}")
    data = {f"{name}.{fmt}": table_bytes(df, fmt) for name, df in run.tables.items()}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = safefs.open_dir(folder)
    except OSError as exc:
        raise UserError(f"cannot write into -o {folder}: {exc.strerror or exc}; choose a writable folder") from None
    try:
        for name, raw in data.items():
            safefs.replace_file(name, raw, dir_fd=fd)
    except OSError as exc:
        raise UserError(f"cannot write into -o {folder}: {exc.strerror or exc}; choose a writable folder") from None
    finally:
        os.close(fd)
    return [folder / name for name in data]
