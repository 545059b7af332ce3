"""What a training dataset's items are made of: their keys, read once and cheaply.

A fix that sorts rows by length (the Trainer's ``group_by_length``) needs each item to carry
``input_ids`` (or a ``length`` column): the Trainer's ``LengthGroupedSampler`` reads
``dataset[0]`` and raises otherwise. The loader event records what the sampler would see, so
the padding rule prescribes it only when it can run.

A ``datasets.Dataset`` names its columns without reading a row. No other dataset is read: an
extra ``dataset[0]`` is the patient's own code run once more (a read from object storage, a
counter, a random augmentation), so its keys stay unknown and the rule does not prescribe.
"""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.common.redact import redact_value

MAX_KEYS = 64  # an item with more keys than this is not a tokenized row
MAX_KEY_CHARS = 64


def describe(dataset: Any) -> tuple[list[str] | None, list[str]]:
    """``(item_keys, item_libs)`` of ``dataset``: its columns (None when it names none) and packages."""
    columns = _columns(dataset)  # no item is read: see the module's docstring
    try:
        libs = _libs(dataset)
    except Exception:  # a user object's ``__getattr__`` raising: the packages are unknown
        libs = []
    return columns, libs


MAX_TABLE_ROWS = 10_000_000  # ~40 MB of lengths for a moment, read in ~0.05 s; beyond, the batches' sample stands
LENGTH_BUCKET = 8  # token lengths kept per 8 (a cap is a multiple of 8): at most MAX_BUCKETS numbers
MAX_BUCKETS = 4096


def row_lengths(dataset: Any) -> tuple[list[int], list[int]] | None:
    """Every row's token length of a ``datasets`` table with an ``input_ids`` column, read from its
    Arrow column without reading an item (``list_value_length``: vectorised, ~4 bytes a row for the
    moment it takes): ``(upper edges, counts)`` per bucket of :data:`LENGTH_BUCKET` tokens, only the
    non-empty ones. A view (``select``, ``shuffle``) counts its own rows. None for anything else: a
    cap that says what it cuts then counts the rows the batches showed (#40 item 7)."""
    columns = _columns(dataset)
    pa = sys.modules.get("pyarrow")
    np = sys.modules.get("numpy")
    if not columns or "input_ids" not in columns or pa is None or np is None:
        return None
    table = getattr(getattr(dataset, "data", None), "table", None)
    if not isinstance(table, pa.Table) or not 0 < table.num_rows <= MAX_TABLE_ROWS:
        return None
    import pyarrow.compute as pc

    lengths = pc.list_value_length(table.column("input_ids"))
    indices = getattr(dataset, "_indices", None)
    if indices is not None:
        lengths = lengths.take(indices.column(0))
    values = np.asarray(lengths.to_numpy(zero_copy_only=False))
    if values.size == 0:
        return None
    counts = np.bincount((values + (LENGTH_BUCKET - 1)) // LENGTH_BUCKET)  # int32 lengths: no wider copy
    kept = counts.nonzero()[0]
    if len(kept) > MAX_BUCKETS:
        return None
    return [int(b) * LENGTH_BUCKET for b in kept], [int(counts[b]) for b in kept]


def item_keys(dataset: Any) -> list[str] | None:
    """The keys of ``dataset``'s items: a ``datasets`` table's columns; None when unknown."""
    return describe(dataset)[0]


def _columns(dataset: Any) -> list[str] | None:
    try:
        columns = getattr(dataset, "column_names", None)
    except Exception:
        return None
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        return _clean(columns)
    return None


_LIBS_MAX = 32  # transforms and item values looked at
# Media decoders: an import of one in the dataset's module (or its ``__getitem__``'s closure) says
# what the items are made of; others (numpy, os) say nothing.
MEDIA_LIBS = frozenset({"PIL", "torchvision", "cv2", "albumentations", "kornia", "timm", "imageio", "skimage",
                        "torchaudio", "librosa", "soundfile", "decord", "av"})
# The packages recorded: library names only, never a name from the user's own code.
KNOWN_LIBS = MEDIA_LIBS | {"torch", "datasets", "transformers", "tokenizers", "numpy"}


def _libs(dataset: Any) -> list[str]:
    """Top-level packages the items are made with: the dataset's class and its ``transform(s)``
    (a ``Compose``'s members too), e.g. ``torchvision``."""
    found: set[str] = set()
    todo: list[Any] = [type(dataset)]
    for attr in ("transform", "transforms", "target_transform"):
        try:
            todo.append(getattr(dataset, attr, None))
        except Exception:
            continue
    found.update(_imported_by(type(dataset)))
    seen = 0
    while todo and seen < 2 * _LIBS_MAX:
        obj = todo.pop()
        seen += 1
        if obj is None:
            continue
        if isinstance(obj, (list, tuple)):
            todo.extend(obj[:_LIBS_MAX])
            continue
        module = getattr(obj if isinstance(obj, type) else type(obj), "__module__", None)
        if isinstance(module, str) and module.split(".")[0] in KNOWN_LIBS:
            found.add(module.split(".")[0])
        inner = getattr(obj, "transforms", None) if not isinstance(obj, type) else None
        if isinstance(inner, (list, tuple)):
            todo.extend(inner[:_LIBS_MAX])
    return sorted(found)


_GLOBALS_MAX = 500


def _imported_by(cls: type) -> set[str]:
    """The modules the dataset class's own module imported (``from PIL import Image``): only its
    namespace is read, never run; a library's dataset (``datasets``, ``torch``) is not looked into."""
    import sys
    import types

    name = getattr(cls, "__module__", None)
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or name is None or name.split(".")[0] in ("torch", "datasets", "transformers", "builtins"):
        return set()
    values = list(getattr(module, "__dict__", {}).values())[:_GLOBALS_MAX]
    # ``__getitem__``'s own free variables: a class defined inside ``main()`` sees its imports there
    getitem = cls.__dict__.get("__getitem__")
    for cell in getattr(getitem, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return {v.__name__.split(".")[0] for v in values
            if isinstance(v, types.ModuleType) and v.__name__.split(".")[0] in MEDIA_LIBS}


def _clean(keys: list[Any] | tuple[Any, ...]) -> list[str]:
    return [redact_value(k)[:MAX_KEY_CHARS] for k in list(keys)[:MAX_KEYS] if isinstance(k, str)]
