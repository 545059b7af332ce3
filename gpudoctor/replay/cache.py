"""Where a config's prepared data lives, and whether it is there, without importing torch.

The prepared folder (:mod:`gpudoctor.replay.prepare` builds it) is named by a digest of what
the data depends on. ``gpudoctor replay`` asks :func:`prepared` before starting a worker to
build it: a config replayed again finds its folder in a file lookup, where a preparing worker
spent about 5 s of CPU importing torch, transformers and datasets to find the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.replay.config import ReplayConfig

SCHEMA = "gpudoctor.replay_prepared/2"  # 2: the probes' lexicon (one synthetic corpus)
META = "meta.json"  # written last, by a rename of the whole folder: its presence means complete


def cache_root() -> Path:
    """``$GPUDOCTOR_REPLAY_CACHE`` or ``~/.cache/gpudoctor/replay``."""
    env = os.environ.get("GPUDOCTOR_REPLAY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpudoctor" / "replay"


def private_root(root: Path | None = None) -> Path:
    """The cache folder, 0700, refused if another user made it or can write it: its
    prepared data and tokenizer are loaded as they are, so no one else may plant them."""
    return safefs.private_dir(root or cache_root(), "the replay cache")


def cache_key(cfg: ReplayConfig) -> str:
    """Digest of what the prepared data depends on (and of the input file's stat)."""
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "dataset": dataclasses.asdict(cfg.dataset),
        "text": dataclasses.asdict(cfg.text),
        "tokenizer": dataclasses.asdict(cfg.tokenizer),
        "max_length": cfg.max_length,
        "padding": cfg.padding,
        "examples": cfg.replay.examples,
    }
    for key in ("dataset", "tokenizer"):
        path = body[key].get("path")
        if path:
            resolved = cfg.resolve(path)
            stat = resolved.stat()
            body[key]["path"] = [str(resolved.resolve()), stat.st_size, stat.st_mtime_ns]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]


def folder(cfg: ReplayConfig, root: Path | None = None) -> Path:
    """Where the config's prepared data is (or will be built)."""
    return private_root(root) / cache_key(cfg)


def prepared(cfg: ReplayConfig, root: Path | None = None) -> Path | None:
    """The config's prepared folder if it is complete, else None (to be built)."""
    at = folder(cfg, root)
    return at if (at / META).is_file() else None
