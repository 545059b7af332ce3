"""What a training dataset's items are made of: their keys, read once and cheaply.

A fix that sorts rows by length (the Trainer's ``group_by_length``) needs each item to carry
``input_ids`` (or a ``length`` column): the Trainer's ``LengthGroupedSampler`` reads
``dataset[0]`` and raises otherwise. The loader event records what the sampler would see, so
the padding rule prescribes it only when it can run.

A ``datasets.Dataset`` names its columns without reading a row; any other map-style dataset
gives its first item once (the same read the sampler makes). An iterable dataset is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudoctor.common.redact import redact_value

MAX_KEYS = 64  # an item with more keys than this is not a tokenized row
MAX_KEY_CHARS = 64


def item_keys(dataset: Any) -> list[str] | None:
    """The keys of ``dataset``'s items; ``[]`` when an item is not a mapping; None when unknown."""
    try:
        columns = getattr(dataset, "column_names", None)
        if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
            return _clean(columns)
        if dataset is None or not hasattr(type(dataset), "__getitem__") or not hasattr(type(dataset), "__len__"):
            return None
        if _is_iterable_dataset(dataset) or len(dataset) < 1:
            return None
        first = dataset[0]
    except Exception:  # the user's dataset: whatever it raises, the keys are unknown
        return None
    if not isinstance(first, Mapping):
        return []
    return _clean(list(first.keys())[:MAX_KEYS])


def _is_iterable_dataset(dataset: Any) -> bool:
    import sys

    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    return isinstance(iterable, type) and isinstance(dataset, iterable)


def _clean(keys: list[Any] | tuple[Any, ...]) -> list[str]:
    return [redact_value(k)[:MAX_KEY_CHARS] for k in list(keys)[:MAX_KEYS] if isinstance(k, str)]
