"""Validate a report dict against :class:`gpudoctor.core.schema.Report`, in one line.

pydantic v2 validates the TypedDicts directly (strict, finite, constraints from the types), so
the schema module is the only statement of what a report holds; this module only turns pydantic's
first error into a line naming the field's path and what it should be. pydantic is imported on
first use: run, attach and the hooks never validate, only commands reading a report.json do.
"""

from __future__ import annotations

import types
import typing
from functools import lru_cache
from typing import Any

from typing_extensions import NotRequired

from gpudoctor.core import schema as rs

_KINDS = {
    "dict_type": "an object", "typed_dict_type": "an object", "list_type": "a list",
    "string_type": "a string", "bool_type": "true or false", "int_type": "a whole number",
    "float_type": "a number", "finite_number": "a finite number",
}


@lru_cache(maxsize=2)
def _adapter(tp: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(tp)


def problem(report: Any, schema: Any = rs.Report) -> str | None:
    """What is wrong with ``report`` as a :class:`~gpudoctor.core.schema.Report` (or as
    ``schema``: :class:`~gpudoctor.core.schema.Sections` for optional sections alone), or None.

    One line: ``cost.wasted_fraction is not a fraction from 0 to 1``, the first error only.
    """
    from pydantic import ValidationError

    try:
        _adapter(schema).validate_python(report)
    except ValidationError as exc:
        return describe(exc.errors(include_url=False, include_input=False)[0], schema)
    return None


def describe(error: Any, schema: Any = rs.Report) -> str:
    """One pydantic error as ``<path> is not <what the schema says it is>``."""
    loc = tuple(error.get("loc") or ())
    path = field_path(loc) or "the report"
    kind = error.get("type", "")
    if kind == "missing":
        return f"{path} is missing"
    says = _says(loc, schema)
    if says is not None and kind not in ("dict_type", "typed_dict_type", "list_type", "missing"):
        return f"{path} is not {says}"
    if kind == "literal_error":
        return f"{path} is not one of {(error.get('ctx') or {}).get('expected', 'the known values')}"
    if kind in ("too_short", "too_long"):
        ctx = error.get("ctx") or {}
        return f"{path} has {ctx.get('actual_length', 'the wrong number of')} items, not the schema's"
    what = _KINDS.get(kind)
    return f"{path} is not {what}" if what else f"{path}: {str(error.get('msg', kind))[:120]}"


def field_path(loc: tuple[Any, ...]) -> str:
    """``("findings", 0, "fix")`` -> ``findings[0].fix``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)[:60]
    return out


def _says(loc: tuple[Any, ...], schema: Any) -> str | None:
    """The :class:`~gpudoctor.core.schema.Says` text of the type at ``loc``, if it has one."""
    tp: Any = schema
    for part in loc:
        tp = _child(_plain(tp), part)
        if tp is None:
            return None
    return _says_of(tp)


def _says_of(tp: Any) -> str | None:
    for arm in _arms(tp):
        for meta in getattr(arm, "__metadata__", ()):
            if isinstance(meta, rs.Says):
                return meta.text
    return None


def _arms(tp: Any) -> list[Any]:
    """``X | None`` -> ``[X]``; anything else -> ``[tp]``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _plain(tp: Any) -> Any:
    """The type under ``Annotated``, ``NotRequired`` and ``| None``."""
    while True:
        arms = _arms(tp)
        if len(arms) != 1:
            return tp
        tp = arms[0]
        origin = typing.get_origin(tp)
        if origin is typing.Annotated or origin is NotRequired:
            tp = typing.get_args(tp)[0]
        elif hasattr(tp, "__metadata__"):
            tp = tp.__origin__
        else:
            return tp


def _child(tp: Any, part: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__"):
        hints = typing.get_type_hints(tp, include_extras=True)
        return hints.get(part)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args and isinstance(part, int):
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None
