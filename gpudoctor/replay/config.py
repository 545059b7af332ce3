"""The replay config: one typed options object, loaded from YAML and validated.

The YAML describes the real training run (dataset, formatting, tokenizer, padding,
model, TrainingArguments, target hardware) plus how to scale it down for a local
replay. Every key is documented in ``sample_configs/README.md``. The sections' types
(:mod:`gpudoctor.replay.sections`) are checked by pydantic; unknown keys and bad values are
one-line ``UserError``s naming the key and its line (:mod:`gpudoctor.replay.schema`), and what
spans keys or looks at the disk is :mod:`gpudoctor.replay.checks`'.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.replay import checks, schema
from gpudoctor.replay.sections import (  # noqa: F401 - the config's types, imported from here too
    SECTION_TYPES,
    BpeSection,
    DatasetSection,
    FullRunSection,
    GpuSpecSection,
    HardwareSection,
    LengthDist,
    ModelSection,
    ReplayConfig,
    ReplaySection,
    Stage,
    TextSection,
    TokenizerSection,
    TrainingSection,
)
from gpudoctor.replay.yamlsrc import load_yaml

MAX_CONFIG_BYTES = 2**20


def _owners() -> dict[str, str]:
    """Key name → the section it belongs to, to say 'belongs under training:'."""
    owners: dict[str, str] = {}
    for section, cls in SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            owners.setdefault(f.name, section)
    for f in dataclasses.fields(ReplayConfig):
        if f.init:
            owners[f.name] = ""
    return {k: v for k, v in owners.items() if v}


def load_config_text(text: str, source: str = "<config>", base_dir: str = ".") -> ReplayConfig:
    """Parse and validate a config given as text; raise ``UserError`` on any problem."""
    data = load_yaml(text, source)
    if data is None:
        raise UserError(f"{source}: the config is empty; it needs at least a dataset: section")
    cfg = schema.validate(ReplayConfig, data, source, elsewhere=_owners())
    if "dataset" not in data:
        raise UserError(
            f"{source}: dataset: section is missing (kind: synthetic | jsonl | text | arrow | disk)"
        )
    checks.check(cfg.placed(source, base_dir, schema.key_lines(data)))
    return cfg


def load_config(path: str | Path) -> ReplayConfig:
    """Read and validate the YAML file at ``path``."""
    p = Path(path)
    try:  # the user named it, so a link is followed; a FIFO or device is refused, never waited on
        with safefs.open_read(os.path.realpath(p)) as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"config file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read config {p}: {exc.__class__.__name__}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UserError(f"config {p} is over the {MAX_CONFIG_BYTES // 2**20} MiB cap for a replay config "
                        "(a real one is a few kB); point dataset.path at the data instead of inlining it")
    return load_config_text(text, source=str(p), base_dir=str(p.parent))


