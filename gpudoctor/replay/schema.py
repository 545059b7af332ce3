"""Build typed dataclasses from YAML mappings, with one-line errors naming key and line.

Generic over the dataclasses in :mod:`gpudoctor.replay.config`: field types come from
the annotations, bounds from ``field(metadata={"ge": 1})``-style metadata. Unknown
keys are errors, with the closest valid key (difflib) or the section a key belongs to.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from gpudoctor.common.errors import UserError
from gpudoctor.replay.yamlsrc import LinedDict


@dataclasses.dataclass
class Ctx:
    """Where we are: the source name and the dotted path → line map being filled."""

    source: str
    lines: dict[str, int]
    elsewhere: dict[str, str]  # key name -> dotted section that owns it (for hints)

    def fail(self, where: str, line: int | None, message: str) -> UserError:
        at = f"{self.source}:{line}" if line else self.source
        subject = f"{where}: " if where else ""
        return UserError(one_line(f"{at}: {subject}{message}"))


def one_line(text: str) -> str:
    """Keep a message on one line even when it quotes the user's odd keys or values."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def show_key(key: Any) -> str:
    return key if isinstance(key, str) and key.isidentifier() else repr(key)


def build(cls: type, data: Any, ctx: Ctx, where: str = "", line: int | None = None) -> Any:
    """Return ``cls(**data)`` after checking every key and value."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        what = where or "the config"
        raise ctx.fail("", line, f"{what} must be a mapping of keys, not {_kind(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    key_lines = data.key_lines if isinstance(data, LinedDict) else {}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_line = key_lines.get(key, line)
        dotted = f"{where}.{show_key(key)}" if where else show_key(key)
        if not isinstance(key, str) or key not in fields:
            raise ctx.fail("", key_line, _unknown_key_message(key, where, sorted(fields), ctx))
        ctx.lines[dotted] = key_line or 0
        kwargs[key] = coerce(value, hints[key], ctx, dotted, key_line, fields[key].metadata)
    return cls(**kwargs)


def _unknown_key_message(key: Any, where: str, valid: list[str], ctx: Ctx) -> str:
    name = f"{where}.{show_key(key)}" if where else show_key(key)
    msg = f"{name} is not a known key"
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    home = ctx.elsewhere.get(str(key))
    if home and home != where:
        msg += f"; it belongs under {home}:"
    elif close:
        msg += f"; did you mean {close[0]}?"
    else:
        msg += f"; valid keys here: {', '.join(valid)}"
    return msg


def coerce(value: Any, hint: Any, ctx: Ctx, where: str, line: int | None, meta: Any = None) -> Any:
    """Check ``value`` against the annotation ``hint``; convert int→float and '1e-4'→float."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return coerce(value, args[0], ctx, where, line, meta)
    if origin is Literal:
        return _literal(value, get_args(hint), ctx, where, line)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, ctx, where, line)
    if origin is list:
        if not isinstance(value, list):
            raise ctx.fail(where, line, f"must be a list, not {_kind(value)}")
        return [coerce(v, get_args(hint)[0], ctx, where, line) for v in value]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ctx.fail(where, line, f"must be a mapping with text keys, not {_kind(value)}")
        return dict(value)
    return _bounded(_scalar(value, hint, ctx, where, line), ctx, where, line, meta or {})


def _literal(value: Any, choices: tuple[Any, ...], ctx: Ctx, where: str, line: int | None) -> Any:
    if isinstance(value, str) and value in choices:
        return value
    msg = f"{value!r} is not one of {' | '.join(map(str, choices))}"
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        msg += f"; did you mean {close[0]}?"
    raise ctx.fail(where, line, msg)


def _scalar(value: Any, hint: Any, ctx: Ctx, where: str, line: int | None) -> Any:
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ctx.fail(where, line, f"must be true or false, not {_kind(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ctx.fail(where, line, f"must be a whole number, not {_kind(value)}")
    if hint is float:
        number = _as_float(value)
        if number is None or not math.isfinite(number):
            raise ctx.fail(where, line, f"must be a number, not {_kind(value)}")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise ctx.fail(where, line, f"must be text, not {_kind(value)}")
    raise ctx.fail(where, line, f"has an unsupported type {hint!r}")  # a bug in config.py


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as text
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _bounded(value: Any, ctx: Ctx, where: str, line: int | None, meta: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "ge" in meta and value < meta["ge"]:
            raise ctx.fail(where, line, f"must be at least {meta['ge']}, got {value}")
        if "gt" in meta and value <= meta["gt"]:
            raise ctx.fail(where, line, f"must be more than {meta['gt']}, got {value}")
        if "le" in meta and value > meta["le"]:
            raise ctx.fail(where, line, f"must be at most {meta['le']}, got {value}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
