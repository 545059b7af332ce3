"""pydantic's verdict on a replay config, as one line naming the key, its line and the fix.

The types in :mod:`gpudoctor.replay.sections` say what each key takes and pydantic checks it;
this module words the first problem the way a user reads it: ``cfg.yaml:5:
training.dataloader_num_workers: must be a whole number, not 'many'``, with the closest valid
key for a misspelled one (difflib) or the section a misplaced key belongs under, and the YAML
line of the key (:class:`~gpudoctor.replay.yamlsrc.LinedDict`). Of several problems the one
earliest in the file is said, as a reader fixing top down meets them; pydantic's dump is not.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from gpudoctor.common.errors import UserError
from gpudoctor.replay.yamlsrc import LinedDict

T = TypeVar("T")
_ADAPTERS: dict[type, TypeAdapter[Any]] = {}  # building one compiles its validator: once per type

_UNKNOWN_KEY = ("unexpected_keyword_argument", "invalid_key", "extra_forbidden")
_NOT_A_SECTION = ("dataclass_type", "dataclass_args_type")
_WANTED = {
    "int_type": "must be a whole number", "float_type": "must be a number",
    "finite_number": "must be a number", "bool_type": "must be true or false",
    "string_type": "must be text", "list_type": "must be a list",
    "dict_type": "must be a mapping with text keys",
}
_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
           "less_than_equal": ("le", "at most")}


def validate(cls: type[T], data: Any, source: str, elsewhere: dict[str, str] | None = None,
             where: str = "") -> T:
    """``cls`` built from ``data``, or a one-line ``UserError`` for the earliest problem.

    ``elsewhere`` maps a key to the section that owns it ('it belongs under training:');
    ``where`` is the dotted path ``data`` sits at, for a part of a config checked alone.
    """
    try:
        return typing.cast(T, _adapter(cls).validate_python(data))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        placed = [(_place(_subject(e["loc"]), data, where), e) for e in errors]
        (line, path), first = min(placed, key=lambda p: p[0][0] or 0)
        at = f"{source}:{line}" if line else source
        raise UserError(one_line(f"{at}: {_words(first, path, cls, elsewhere or {})}")) from None


def field_value(cls: type, name: str, value: Any, source: str, where: str) -> Any:
    """``value`` checked as the key ``name`` of ``cls`` (at dotted ``where``) in a config file."""
    built: object = validate(cls, {name: value}, source, where=where.rpartition(".")[0])
    return getattr(built, name)


def key_lines(data: Any, prefix: str = "") -> dict[str, int]:
    """Dotted key → its YAML line, for every key of every mapping in ``data``."""
    lines: dict[str, int] = {}
    if isinstance(data, dict):
        known = data.key_lines if isinstance(data, LinedDict) else {}
        for key, value in data.items():
            dotted = f"{prefix}{show_key(key)}"
            lines[dotted] = known.get(key, 0)
            lines.update(key_lines(value, dotted + "."))
    return lines


def one_line(text: str) -> str:
    """Keep a message on one line even when it quotes the user's odd keys or values."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def show_key(key: Any) -> str:
    return key if isinstance(key, str) and key.isidentifier() else repr(key)


def _adapter(cls: type) -> TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _subject(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Where the error is: a mapping whose key is wrong (``(..., key, "[key]")``) is the subject."""
    return loc[:-2] if loc[-1:] == ("[key]",) else loc


def _place(loc: tuple[int | str, ...], data: Any, where: str) -> tuple[int | None, str]:
    """The YAML line of the deepest key on ``loc`` and the dotted path (``[i]`` for a list item)."""
    line, path, node = None, where, data
    for part in loc:
        if isinstance(node, list) and isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if 0 <= part < len(node) else None
            continue
        if isinstance(node, LinedDict):
            line = node.key_lines.get(part, line)
        path = f"{path}.{show_key(part)}" if path else show_key(part)
        node = node.get(part) if isinstance(node, dict) else None
    return line, path


def _words(error: ErrorDetails, path: str, cls: type, elsewhere: dict[str, str]) -> str:
    kind, value, loc = error["type"], error.get("input"), error["loc"]
    if kind in _UNKNOWN_KEY:
        return _unknown_key(path, loc, cls, elsewhere)
    if kind in _NOT_A_SECTION:
        return f"{path or 'the config'} must be a mapping of keys, not {_kind(value)}"
    if kind == "literal_error":
        return f"{path}: {_not_a_choice(value, _type_at(cls, loc))}"
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        bound = (error.get("ctx") or {}).get(name)
        return f"{path}: must be {words} {bound:g}, got {_kind(_as_number(value))}"
    if loc and loc[-1] == "[key]":
        return f"{path}: must be a mapping with text keys, not {_kind(value)}"
    if kind in _WANTED:
        return f"{path}: {_WANTED[kind]}, not {_kind(value)}"
    return f"{path}: {' '.join(str(error.get('msg', kind)).split())[:160]}"  # a type not worded yet


def _unknown_key(path: str, loc: tuple[int | str, ...], cls: type, elsewhere: dict[str, str]) -> str:
    key = loc[-1]
    owner = _type_at(cls, loc[:-1])
    valid = sorted(f.name for f in dataclasses.fields(owner) if f.init) if dataclasses.is_dataclass(owner) else []
    message = f"{path} is not a known key"
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    home = elsewhere.get(str(key))
    if home and home != ".".join(map(str, loc[:-1])):
        return message + f"; it belongs under {home}:"
    if close:
        return message + f"; did you mean {close[0]}?"
    return message + f"; valid keys here: {', '.join(valid)}"


def _not_a_choice(value: Any, hint: Any) -> str:
    choices = [str(c) for c in get_args(hint)] if get_origin(hint) is Literal else []
    message = f"{value!r} is not one of {' | '.join(choices)}"
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    return message + (f"; did you mean {close[0]}?" if close else "")


def _type_at(cls: Any, loc: tuple[int | str, ...]) -> Any:
    """The type (``Annotated`` and ``| None`` taken off) a config key at ``loc`` has, or None."""
    tp = cls
    for part in loc:
        if not dataclasses.is_dataclass(tp):
            return None
        tp = _plain(typing.get_type_hints(tp).get(str(part)))
    return tp


def _plain(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        arms = [a for a in get_args(hint) if a is not type(None)]
        return arms[0] if len(arms) == 1 else hint
    return hint


def _as_number(value: Any) -> Any:
    """'-1e-4' as YAML 1.1 reads it, shown as the number it was taken for."""
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
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
