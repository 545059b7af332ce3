"""A point as a config: the user's YAML with the point's values set, validated by the
replay's own loader, and a cache key that is the digest of that effective config
and of how it is measured.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpudoctor._version import __version__
from gpudoctor.common.errors import UserError
from gpudoctor.render.sweep_cells import short
from gpudoctor.replay.config import ReplayConfig, load_config_text
from gpudoctor.sweep.plan import Point

TRIAL_SCHEMA = "gpudoctor.sweep_trial/1"
PATH_KEYS = (("dataset", "path"), ("tokenizer", "path"), ("model", "path"))


def read_raw(path: Path) -> dict[str, Any]:
    """The config file as plain data (already validated by ``load_config``)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def apply(raw: dict[str, Any], params: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A copy of ``raw`` with ``params`` set and relative paths made absolute.

    Absolute paths let the trial's YAML live in the cache, away from the config.
    """
    data = copy.deepcopy(raw)
    for dotted, value in params.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    for section, key in PATH_KEYS:
        value = (data.get(section) or {}).get(key)
        if isinstance(value, str) and not Path(value).expanduser().is_absolute():
            data[section][key] = str((base_dir / value).resolve())
    return data


def dump(data: dict[str, Any]) -> str:
    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)  # yaml: no stubs
    return text


def validate(text: str, label: str, base_dir: Path) -> ReplayConfig:
    """The point's config, or a ``UserError`` when the combination is not valid."""
    return load_config_text(text, source=label, base_dir=str(base_dir))


def cache_key(cfg: ReplayConfig, protocol: dict[str, Any], cores: int) -> str:
    """Digest of the effective config, the measuring protocol and the cores it ran on."""
    body = {
        "schema": TRIAL_SCHEMA,
        "version": __version__,
        "config": cfg.sha256(),
        "protocol": protocol,
        "cores": cores,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def label(params: dict[str, Any]) -> str:
    """``workers=2 batch=8`` style short text for tables and progress lines."""
    return " ".join(f"{short(k)}={v}" for k, v in params.items()) or "(config as is)"


def check_label(exc: UserError) -> str:
    """A config error about a point, without the temp file name in front."""
    text = str(exc)
    return text.split(": ", 1)[1] if ": " in text else text


@dataclass
class Resolved:
    """A point made concrete: its config text and cache key, or (``point.skip``) why not."""

    point: Point
    entry: dict[str, Any]
    cfg: ReplayConfig | None = None
    yaml_text: str | None = None
    key: str | None = None


def resolve(
    point: Point,
    entry: dict[str, Any],
    raw: dict[str, Any],
    base_dir: Path,
    fixed: dict[str, Any],
    protocol: dict[str, Any],
    cores: int,
) -> Resolved:
    """The point's config, validated as a file would be, and its cache key."""
    item = Resolved(point, entry)
    if point.skip:
        return item
    text = dump(apply(raw, {**fixed, **point.params}, base_dir))
    try:
        item.cfg = validate(text, f"point {entry['label']}", base_dir)
    except UserError as exc:
        point.skip = f"not a valid config: {check_label(exc)}"
        return item
    item.yaml_text, item.key = text, cache_key(item.cfg, protocol, cores)
    return item
