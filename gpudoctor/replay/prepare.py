"""Everything a real project would have on disk before training starts.

The synthetic data, a BPE trained on it, and the work the config places
``ahead`` (pre-formatting, pre-tokenizing, packing) are built once into a cache
folder, so the profiled worker's startup holds only what the config does at
startup, as on the real machine. Run ``worker --prepare-only`` first to keep even
a cache miss out of the profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.replay import synthetic
from gpudoctor.replay.cache import META, SCHEMA
from gpudoctor.replay.cache import folder as prepared_folder
from gpudoctor.replay.checks import template_fields
from gpudoctor.replay.config import BpeSection, ReplayConfig
from gpudoctor.replay.data import TextOps, pack

SPECIALS = ("<|endoftext|>", "<|pad|>")


def prepare(cfg: ReplayConfig, root: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Return the prepared folder for ``cfg`` and its meta, building it if missing."""
    folder = prepared_folder(cfg, root)
    meta_path = folder / META
    if meta_path.is_file():
        return folder, {**json.loads(meta_path.read_text()), "cache_hit": True}
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        meta = _build(cfg, tmp)
        (tmp / META).write_text(json.dumps(meta))
        with contextlib.suppress(OSError):  # another process finished first: use theirs
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, {**json.loads(meta_path.read_text()), "cache_hit": False}


def _build(cfg: ReplayConfig, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    tokenizer = None
    if cfg.dataset.kind == "synthetic":
        rows, total, tokenizer = _synthetic_rows(cfg)
    else:
        rows, total = _file_rows(cfg)
    t_rows = time.perf_counter()
    ops = TextOps(cfg.text.template, cfg.text.field, _Pad0(), cfg.max_length, cfg.padding, True)
    texts = [ops.format(r) for r in rows]
    if tokenizer is None:
        tokenizer = load_or_train_tokenizer(cfg, texts)
    t_tok = time.perf_counter()
    raw_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    lengths = [len(x) for x in raw_ids]
    columns = _ahead_columns(cfg, rows, texts, raw_ids, tokenizer)
    import datasets

    datasets.disable_progress_bars()  # only here: the worker's own maps show theirs, as a script's would
    datasets.Dataset.from_dict(columns).save_to_disk(str(out / "data"))
    datasets.enable_progress_bars()
    tokenizer.save_pretrained(str(out / "tokenizer"))
    t_end = time.perf_counter()
    return {
        "schema": SCHEMA,
        "examples": len(rows),
        "rows_total": total,
        "columns": sorted(columns),
        "raw_lengths": lengths,
        "vocab_size": len(tokenizer),
        "tokenizer_kind": "path" if cfg.tokenizer.path else "trained_bpe",
        "timings_s": {
            "rows_s": t_rows - t0,
            "tokenizer_s": t_tok - t_rows,
            "ahead_s": t_end - t_tok,
        },
    }


class _Pad0:
    """Stand-in tokenizer for formatting only (TextOps wants a pad id)."""

    pad_token_id = 0


def _synthetic_rows(cfg: ReplayConfig) -> tuple[list[dict[str, str]], int, Any]:
    ds = cfg.dataset
    fields = ds.fields or template_fields(cfg.text.template) or [cfg.text.field]
    count = min(ds.count or 1, cfg.replay.examples)
    tokenizer = None
    cost = None
    overhead = 0
    if ds.length.unit == "tokens":
        if cfg.tokenizer.path:
            tokenizer = load_or_train_tokenizer(cfg, [])
        else:
            n = min(count, _bpe(cfg).train_examples)
            words_spec = dataclasses.replace(ds.length, unit="words")
            draft = synthetic.generate(n, words_spec, fields, seed=ds.seed)
            ops = TextOps(
                cfg.text.template, cfg.text.field, _Pad0(), cfg.max_length, cfg.padding, True
            )
            tokenizer = load_or_train_tokenizer(cfg, [ops.format(r) for r in draft])
        cost = _word_cost(tokenizer)
        if cfg.text.template:
            empty = cfg.text.template.format_map(dict.fromkeys(fields, ""))
            overhead = len(tokenizer(empty, add_special_tokens=False)["input_ids"])
    rows = synthetic.generate(
        count, ds.length, fields, seed=ds.seed, word_cost=cost, overhead_tokens=overhead
    )
    return rows, ds.count or count, tokenizer


def _word_cost(tokenizer: Any) -> Callable[[str], int]:
    cache: dict[str, int] = {}

    def cost(word: str) -> int:
        if word not in cache:
            cache[word] = max(1, len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]))
        return cache[word]

    return cost


def _file_rows(cfg: ReplayConfig) -> tuple[list[dict[str, Any]], int]:
    path = cfg.resolve(cfg.dataset.path or "")
    cap = cfg.replay.examples
    kind = cfg.dataset.kind
    if kind in ("jsonl", "text"):
        return _read_lines(path, kind, cap)
    import datasets

    if kind == "arrow":
        data = datasets.Dataset.from_file(str(path))
    else:
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            split = cfg.dataset.split or ("train" if "train" in data else next(iter(data)))
            if split not in data:
                raise cfg.error(
                    "dataset.split",
                    f"{split!r} is not a split of {path} (it has {', '.join(data)})",
                )
            data = data[split]
    return [dict(r) for r in data.select(range(min(cap, len(data))))], len(data)


def _read_lines(path: Path, kind: str, cap: int) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    total = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            total += 1
            if len(rows) >= cap:
                continue
            if kind == "text":
                rows.append({"text": line.rstrip("\n")})
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}:{number}: not a JSON object on this line") from None
            if not isinstance(row, dict):
                raise UserError(
                    f"{path}:{number}: each JSONL line must be an object, not {type(row).__name__}"
                )
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no examples in the file")
    return rows, total


def _bpe(cfg: ReplayConfig) -> BpeSection:
    return cfg.tokenizer.train_bpe or BpeSection()


def load_or_train_tokenizer(cfg: ReplayConfig, texts: list[str]) -> Any:
    """The tokenizer at ``tokenizer.path`` (offline), else a byte-level BPE trained on ``texts``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if cfg.tokenizer.path:
        tok = AutoTokenizer.from_pretrained(
            str(cfg.resolve(cfg.tokenizer.path)), local_files_only=True
        )
        if tok.pad_token is None:
            if tok.eos_token is not None:
                tok.pad_token = tok.eos_token
            else:
                tok.add_special_tokens({"pad_token": SPECIALS[1], "eos_token": SPECIALS[0]})
        return tok
    bpe = _bpe(cfg)
    core = synthetic.train_bpe(texts[: bpe.train_examples], bpe.vocab_size, SPECIALS)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers: unannotated
        tokenizer_object=core, eos_token=SPECIALS[0], pad_token=SPECIALS[1]
    )


def _ahead_columns(
    cfg: ReplayConfig,
    rows: list[dict[str, Any]],
    texts: list[str],
    raw_ids: list[list[int]],
    tokenizer: Any,
) -> dict[str, list[Any]]:
    """Columns of the on-disk data: raw fields, pre-formatted text, token ids or packed chunks."""
    if cfg.tokenizer.tokenize_at == "ahead":
        if cfg.padding == "packing":
            return {"input_ids": pack(raw_ids, cfg.max_length, int(tokenizer.eos_token_id))}
        return {"input_ids": [ids[: cfg.max_length] for ids in raw_ids]}
    if cfg.text.format_at == "ahead":
        return {"text": texts}
    names = list(rows[0])
    return {name: [r.get(name) for r in rows] for name in names}


def load_prepared(folder: Path) -> tuple[Any, Any]:
    """The prepared Arrow dataset (``load_from_disk``) and tokenizer."""
    import datasets
    from transformers import AutoTokenizer

    data = datasets.load_from_disk(str(folder / "data"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"), local_files_only=True)
    return data, tokenizer
