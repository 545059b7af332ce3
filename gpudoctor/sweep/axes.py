"""``--grid KEY=V1,V2``: resolve a key against the replay config and type its values.

Keys are the config's own (``training.dataloader_num_workers``,
``model.config.n_head``) or a bare ``TrainingArguments``-style name looked up in
``training:`` first. Values are checked against the config's own types (pydantic, worded
by :mod:`gpudoctor.replay.schema`), so a grid accepts exactly what a config file would, and
refuses it in one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, NoReturn, Union, get_args, get_origin

import yaml

from gpudoctor.common.errors import UserError
from gpudoctor.replay.config import SECTION_TYPES, ReplayConfig
from gpudoctor.replay.schema import field_value, one_line

WORKERS = "training.dataloader_num_workers"
BATCH = "training.per_device_train_batch_size"
ACCUM = "training.gradient_accumulation_steps"
GPUS = "hardware.gpus"


@dataclass(frozen=True)
class Axis:
    """One grid dimension: a dotted config key and the values to try, in order."""

    key: str
    values: tuple[Any, ...]

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]


def _unwrap(hint: Any) -> Any:
    """``int | None`` -> ``int``: optional keys are swept by their value type."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def leaf_keys(cls: type = ReplayConfig, prefix: str = "") -> list[str]:
    """Every dotted key that holds a value (for 'did you mean')."""
    keys: list[str] = []
    for name, hint in _fields(cls).items():
        inner = _unwrap(hint)
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            keys += leaf_keys(inner, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _bare(name: str) -> str:
    """The dotted key a bare name means: top level, then ``training``, then a unique section."""
    if name in SECTION_TYPES:
        raise UserError(f"--grid {name}: a section, not a value; name a key inside it ({name}.KEY)")
    top = _fields(ReplayConfig)
    if name in top:
        return name
    if name in _fields(SECTION_TYPES["training"]):
        return f"training.{name}"
    owners = [s for s, cls in SECTION_TYPES.items() if name in _fields(cls)]
    if len(owners) == 1:
        return f"{owners[0]}.{name}"
    if owners:
        raise UserError(
            f"--grid {name}: ambiguous; write it as one of {', '.join(f'{o}.{name}' for o in owners)}"
        )
    _unknown(name)


def _unknown(key: str) -> NoReturn:
    known = leaf_keys()
    last = key.rsplit(".", 1)[-1]
    close = [k for k in known if k.endswith("." + last)][:1] or difflib.get_close_matches(
        key, known, n=1, cutoff=0.6
    )
    hint = f"; did you mean {close[0]}?" if close else "; see sample_configs/README.md for the keys"
    raise UserError(one_line(f"--grid {key}: not a config key{hint}"))


def resolve_key(text: str) -> tuple[str, type | None]:
    """``(dotted key, the section that types it)`` for a grid key, or a one-line error; the
    section is None for a ``model.config`` field, which the architecture checks."""
    dotted = text if "." in text else _bare(text)
    cls: Any = ReplayConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = _fields(cls)
        if part not in fields:
            _unknown(dotted)
        inner = _unwrap(fields[part])
        rest = parts[i + 1 :]
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            if not rest:
                raise UserError(f"--grid {dotted}: a section, not a value; name a key inside it")
            cls = inner
            continue
        if get_origin(inner) is dict and len(rest) == 1:
            return dotted, None
        if rest or get_origin(inner) in (list, dict):
            raise UserError(f"--grid {dotted}: not a single value that a grid can vary")
        return dotted, cls
    raise UserError(f"--grid {text}: empty key")  # unreachable: split always yields a part


def parse_axis(spec: str) -> Axis:
    """``KEY=V1,V2`` -> an :class:`Axis` with typed, de-duplicated values."""
    key, sep, values_text = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(
            one_line(f"--grid {spec!r}: write it as KEY=V1,V2 (e.g. dataloader_num_workers=0,2,4)")
        )
    dotted, section = resolve_key(key)
    raw = [v.strip() for v in values_text.split(",")]
    if not values_text.strip() or any(not v for v in raw):
        raise UserError(
            one_line(f"--grid {key}={values_text}: an empty value; list values as V1,V2,...")
        )
    name = dotted.rsplit(".", 1)[-1]
    values: list[Any] = []
    for text in raw:
        value = _scalar(text) if section is None else field_value(section, name, _scalar(text), "--grid", dotted)
        if value not in values:
            values.append(value)
    return Axis(dotted, tuple(values))


def _scalar(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if not isinstance(value, (dict, list)) else text


def parse_grid(specs: list[str]) -> list[Axis]:
    """All ``--grid`` options; an empty grid or a key given twice is an error."""
    if not specs:
        raise UserError(
            "no --grid given; e.g. --grid dataloader_num_workers=0,2,4 --grid per_device_train_batch_size=4,8"
        )
    axes = [parse_axis(s) for s in specs]
    seen: set[str] = set()
    for axis in axes:
        if axis.key in seen:
            raise UserError(f"--grid {axis.key} is given twice; list all its values in one --grid")
        seen.add(axis.key)
    return axes


def current_value(cfg: ReplayConfig, dotted: str) -> Any:
    """The value ``dotted`` has in the user's config (defaults included)."""
    obj: Any = cfg
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj
