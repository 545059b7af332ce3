"""Apply a fix inside the training process, for ``gpudoctor try``: no code edited.

``gpudoctor try`` writes the fix's values to a JSON file in its run folder and names it in
``GPUDOCTOR_APPLY``. At install, the hooks read it and change the arguments of the calls
they already see: ``TrainingArguments`` fields (set before its ``__post_init__``, so the
library still validates them), ``DataLoader(...)`` arguments, tokenizer call arguments, and the
data-parallel wrappers' (``DistributedDataParallel(...)``, ``fully_shard(...)``, FSDP1's class).
What was actually changed is recorded as ``applied`` events, so the report shows what ran,
not what was asked. Stdlib-only, like the rest of the injected part.

Never fatal: every body of ours is guarded, and when ``TrainingArguments`` refuses our
values (``__post_init__`` raises), the object is put back and validated with the user's
own values, so the trial runs as written rather than dying (the event says why).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import time
from types import ModuleType
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.hooks import imports, patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

ENV = "GPUDOCTOR_APPLY"
SCHEMA = "gpudoctor.apply/1"
MAX_SPEC_BYTES = 64 * 1024
MAX_EVENTS_PER_CALL = 5  # a loader built every epoch is said a few times, not thousands

LOADER_KEYS = {"num_workers": int, "persistent_workers": bool, "prefetch_factor": int, "pin_memory": bool}
TOKENIZER_KEYS = {"max_length": int, "padding": (bool, str), "pad_to_multiple_of": int, "truncation": (bool, str)}
SAVE_KEYS = {"keep_every": int}  # torch.save in a hand-written loop: keep every k-th checkpoint
MODEL_CHECKPOINT_KEYS = {"every_n_train_steps": int, "save_weights_only": bool, "save_top_k": int}
DDP_KEYS = {"find_unused_parameters": bool, "static_graph": bool, "gradient_as_bucket_view": bool,
            "bucket_cap_mb": (int, float)}
FULLY_SHARD_KEYS = {"reshard_after_forward": bool}
FSDP1_KEYS = {"sharding_strategy": str}  # a ShardingStrategy's name (SHARD_GRAD_OP)
DDP_SYNC_KEYS = {"every": int}  # DDP all-reduces on the last of every this many micro-steps (no_sync() on the rest)
Scalar = int | float | bool | str | None


class Overrides:
    """The values to apply, one mapping per call the hooks see."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.rule = str(spec.get("rule") or "")
        self.training_arguments = _scalars(spec.get("training_arguments"), None)
        self.dataloader = _scalars(spec.get("dataloader"), LOADER_KEYS)
        self.tokenizer = _scalars(spec.get("tokenizer"), TOKENIZER_KEYS)
        self.torch_save = _scalars(spec.get("torch_save"), SAVE_KEYS)
        self.saves_seen = 0
        self.saves_skipped = 0
        self.last_saved: str | None = None  # the last checkpoint really written (an absolute path)
        self.stand_ins = 0  # skipped saves whose path got the last real checkpoint (a hard link)
        self.model_checkpoint = _scalars(spec.get("model_checkpoint"), MODEL_CHECKPOINT_KEYS)
        self.ddp = _scalars(spec.get("ddp"), DDP_KEYS)
        self.fully_shard = _scalars(spec.get("fully_shard"), FULLY_SHARD_KEYS)
        self.fsdp1 = _scalars(spec.get("fsdp1"), FSDP1_KEYS)
        self.ddp_sync = _scalars(spec.get("ddp_sync"), DDP_SYNC_KEYS)
        self.said: dict[str, int] = {}


_overrides: Overrides | None = None
_writer: EventWriter | None = None


def _scalars(section: Any, allowed: dict[str, Any] | None) -> dict[str, Scalar]:
    """Only plain values under known (or identifier) names: the file is ours, but stays checked."""
    if not isinstance(section, dict):
        return {}
    out: dict[str, Scalar] = {}
    for key, value in section.items():
        if not isinstance(key, str) or not key.isidentifier():
            continue
        if allowed is not None:
            kind = allowed.get(key)
            if kind is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                continue
        elif value is not None and not isinstance(value, (int, float, bool, str)):
            continue
        out[key] = value
    return out


def load(path: str) -> Overrides | None:
    """The overrides in ``path`` (ours, 0600, not a link), or None when unreadable."""
    try:
        data = json.loads(safefs.read_bytes(path, owner=os.geteuid(), limit=MAX_SPEC_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        print(f"gpudoctor: the fix to try ({path}) could not be read ({exc}); running unchanged",
              file=sys.stderr)
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    return Overrides(data)


def install(writer: EventWriter) -> None:
    """Read ``GPUDOCTOR_APPLY`` (if set) and patch the calls its values belong to."""
    global _overrides, _writer
    path = os.environ.get(ENV)
    if not path or _overrides is not None:
        return
    found = load(path)
    if found is None:
        return
    _overrides, _writer = found, writer
    if found.dataloader:
        imports.when_imported("torch.utils.data.dataloader", _install_dataloader)
    if found.training_arguments:
        imports.when_imported("transformers.training_args", _install_training_arguments)
    if found.fully_shard:  # the script's ``from torch.distributed.fsdp import fully_shard`` gets ours
        for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
            imports.when_imported(name, _install_fully_shard)
    if found.fsdp1:
        imports.when_imported("torch.distributed.fsdp.fully_sharded_data_parallel", _install_fsdp1)


def active() -> bool:
    return _overrides is not None


def _emit(call: str, values: dict[str, Any], was: dict[str, Any], skipped: dict[str, str]) -> None:
    o, w = _overrides, _writer
    if o is None or w is None:
        return
    o.said[call] = o.said.get(call, 0) + 1
    if o.said[call] <= MAX_EVENTS_PER_CALL:
        w.emit({"k": "applied", "t": time.time(), "rule": o.rule, "call": call, "values": values,
                "was": was, "skipped": skipped, "pid": os.getpid()})


# -- DataLoader(...) ------------------------------------------------------------------
def _install_dataloader(mod: ModuleType) -> None:
    loader = getattr(mod, "DataLoader", None)
    if loader is not None:
        patch.replace(loader, "__init__", _wrap_loader_init)


def _wrap_loader_init(fn: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        changed = _loader_arguments(fn, self, args, kwargs)
        if changed is not None:
            args, kwargs = changed
        try:
            fn(self, *args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise

    return __init__


@guarded("apply DataLoader fix")
def _loader_arguments(fn: Any, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    o = _overrides
    if o is None or not o.dataloader:
        return None
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(self, *args, **kwargs)
    except TypeError:  # the call is wrong as written: the loader will say so itself
        return None
    params = sig.parameters

    def current(name: str) -> Any:
        if name in bound.arguments:
            return bound.arguments[name]
        return params[name].default if name in params else None

    values: dict[str, Any] = {}
    was: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in o.dataloader.items():
        if key not in params:
            skipped[key] = f"this DataLoader ({type(self).__name__}) takes no {key} argument"
            continue
        was[key], values[key] = current(key), value
        bound.arguments[key] = value
    if current("num_workers") == 0:  # torch refuses these without workers
        for key, off in (("prefetch_factor", None), ("persistent_workers", False)):
            if key not in params:
                continue
            if key in values and values[key] != off:
                skipped[key] = "only with num_workers > 0"
                del values[key]
                bound.arguments[key] = was.pop(key)
            if "num_workers" in values and current(key) != off:  # we took the workers away
                was.setdefault(key, current(key))
                values[key] = bound.arguments[key] = off
    _emit("DataLoader", values, was, skipped)
    return bound.args[1:], bound.kwargs


# -- TrainingArguments ----------------------------------------------------------------
def _install_training_arguments(mod: ModuleType) -> None:
    cls = getattr(mod, "TrainingArguments", None)
    if cls is not None:
        patch.replace(cls, "__post_init__", _wrap_post_init)


def _wrap_post_init(fn: Any) -> Any:
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _set_fields(self)
        if before is None:
            try:
                return fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
        try:
            result = fn(self, *args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            if not isinstance(exc, Exception) or not _put_back(self, before, exc):
                raise
            try:
                return fn(self, *args, **kwargs)  # the user's own values, validated as written
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
        _fields_kept(self, before)
        return result

    return __post_init__


@guarded("apply TrainingArguments fix")
def _set_fields(self: Any) -> dict[str, Any] | None:
    o = _overrides
    if o is None or not o.training_arguments:
        return None
    snapshot = dict(self.__dict__)
    for key, value in o.training_arguments.items():
        if key in snapshot:
            setattr(self, key, value)
    return snapshot


@guarded("apply TrainingArguments fix", default=False)
def _put_back(self: Any, before: dict[str, Any], exc: Exception) -> bool:
    self.__dict__.clear()
    self.__dict__.update(before)
    o = _overrides
    asked = dict(o.training_arguments) if o is not None else {}
    reason = f"TrainingArguments refused them: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    _emit("TrainingArguments", {}, {}, {key: reason for key in asked})
    return True


@guarded("apply TrainingArguments fix")
def _fields_kept(self: Any, before: dict[str, Any]) -> None:
    o = _overrides
    if o is None:
        return
    values: dict[str, Any] = {}
    was: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key in o.training_arguments:
        if key not in before:
            skipped[key] = "this transformers' TrainingArguments has no such field"
            continue
        values[key], was[key] = _plain(getattr(self, key, None)), _plain(before[key])
    _emit("TrainingArguments", values, was, skipped)


def _plain(value: Any) -> Scalar:
    if value is None or isinstance(value, (int, float, bool, str)):
        return value
    return str(getattr(value, "value", value))  # enums (save_strategy) as their value


# -- tokenizer(...) -------------------------------------------------------------------
def tokenizer_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer call's keyword arguments with the fix's values (called by the tokenizer hook)."""
    changed = _tokenizer_kwargs(kwargs)
    return kwargs if changed is None else changed


@guarded("apply tokenizer fix")
def _tokenizer_kwargs(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    o = _overrides
    if o is None or not o.tokenizer:
        return None
    out = {**kwargs, **o.tokenizer}
    if o.said.get("tokenizer", 0) < 1:
        _emit("tokenizer", dict(o.tokenizer), {k: kwargs.get(k) for k in o.tokenizer}, {})
    return out


# -- torch.save(...) in a hand-written loop ------------------------------------------
def skip_save() -> bool:
    """Whether this checkpoint ``torch.save`` is thinned out (called by the save hook).

    The loop's save interval is its own code; the trial keeps every k-th save (the 1st, (k+1)-th,
    ...) and skips the others, so it runs as ``save_every × k`` would. Each call is counted. The
    first is kept so that every skipped save has a real checkpoint to stand in for it
    (:func:`stand_in`).
    """
    return bool(_skip_save())


@guarded("apply torch.save thinning", default=False)
def _skip_save() -> bool:
    o = _overrides
    k = o.torch_save.get("keep_every") if o is not None else None
    if o is None or not isinstance(k, int) or k <= 1:
        return False
    o.saves_seen += 1
    skip = (o.saves_seen - 1) % k != 0
    o.saves_skipped += skip
    if o.saves_seen == 1:
        _emit("torch.save", {"keep_every": k}, {"keep_every": 1}, {})
    return skip


@guarded("apply torch.save thinning")
def saved(f: Any) -> None:
    """A checkpoint was really written to ``f``: the file a later skipped save stands in with."""
    if _overrides is not None and isinstance(f, (str, bytes, os.PathLike)):
        _overrides.last_saved = os.path.abspath(os.fsdecode(f))


@guarded("apply torch.save thinning")
def stand_in(f: Any) -> None:
    """A skipped save leaves what the script expects at the path it asked for: the last checkpoint
    really written, hard-linked there from its newest name (a loop that keeps the last two has
    removed the first by then) (no bytes written: the trial measures the thinned interval),
    so the script's ``os.fsync``, rename, rotation or upload of that path still works. A save to an
    open file or buffer is left empty; a file system without hard links gets nothing either."""
    o = _overrides
    if o is None or o.last_saved is None or not isinstance(f, (str, bytes, os.PathLike)):
        return
    dest = os.path.abspath(os.fsdecode(f))
    if dest == o.last_saved:
        return  # the script saves over one file: the last real save is there already
    tmp = f"{dest}.gpudoctor-{os.getpid()}.tmp"
    try:
        os.link(o.last_saved, tmp)
        os.replace(tmp, dest)  # as the save would have: the name points at a whole file at once
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    o.stand_ins += 1
    o.last_saved = dest  # the same checkpoint under its newest name: the loop's rotation may remove the older

# -- Lightning's ModelCheckpoint(...) ---------------------------------------------------
def model_checkpoint_kwargs(fn: Any, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``ModelCheckpoint``'s keyword arguments with the fix's values (called by the Lightning hook)."""
    changed = _model_checkpoint_kwargs(fn, self, args, kwargs)
    return kwargs if changed is None else changed


@guarded("apply ModelCheckpoint fix")
def _model_checkpoint_kwargs(fn: Any, self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                             ) -> dict[str, Any] | None:
    o = _overrides
    if o is None or not o.model_checkpoint:
        return None
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(self, *args, **kwargs)
    except TypeError:  # wrong as written: ModelCheckpoint will say so itself
        return None
    params = sig.parameters
    out = dict(kwargs)
    values: dict[str, Any] = {}
    was: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in o.model_checkpoint.items():
        if key not in params:
            skipped[key] = "this Lightning's ModelCheckpoint takes no such argument"
            continue
        if key in bound.arguments and key not in kwargs:
            skipped[key] = "given positionally; left as written"
            continue
        was[key] = bound.arguments.get(key, params[key].default)
        values[key] = out[key] = value
    _emit("ModelCheckpoint", values, {k: _plain(v) for k, v in was.items()}, skipped)
    return out


# -- the data-parallel wrappers: DistributedDataParallel(...), fully_shard(...), FSDP1 ------------
def call_kwargs(section: str, call: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                first: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fn``'s arguments with the fix's values of ``section`` (``ddp``, ``fully_shard``, ``fsdp1``),
    bound by name (a value given positionally is replaced too); the call as written otherwise.
    ``first``: leading arguments not to hand back (``self``). Called by the DDP hook as well."""
    changed = _call_kwargs(section, call, fn, args, kwargs)
    new_args, new_kwargs = changed if changed is not None else (args, kwargs)
    return new_args[first:], new_kwargs


@guarded("apply data-parallel fix")
def _call_kwargs(section: str, call: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    o = _overrides
    values_in: dict[str, Scalar] = (getattr(o, section, None) or {}) if o is not None else {}
    if not values_in:
        return None
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:  # wrong as written: the call will say so itself
        return None
    params = sig.parameters
    values: dict[str, Any] = {}
    was: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in values_in.items():
        if key not in params:
            skipped[key] = f"this {call} takes no {key} argument"
            continue
        current = bound.arguments.get(key, params[key].default)
        was[key] = current.name if key == "sharding_strategy" and hasattr(current, "name") else _plain(current)
        bound.arguments[key] = _sharding_strategy(value) if key == "sharding_strategy" else value
        values[key] = value
    _emit(call, values, was, skipped)
    return bound.args, bound.kwargs


def _sharding_strategy(name: Any) -> Any:
    from torch.distributed.fsdp import ShardingStrategy

    return ShardingStrategy[str(name)]


def _install_fully_shard(mod: ModuleType) -> None:
    if callable(getattr(mod, "fully_shard", None)):
        patch.replace(mod, "fully_shard", _wrap_fully_shard)


def _wrap_fully_shard(fn: Any) -> Any:
    def fully_shard(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = call_kwargs("fully_shard", "fully_shard", fn, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise

    return fully_shard


def _install_fsdp1(mod: ModuleType) -> None:
    cls = getattr(mod, "FullyShardedDataParallel", None)
    if cls is not None:
        patch.replace(cls, "__init__", _wrap_fsdp1_init)


def _wrap_fsdp1_init(fn: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        args, kwargs = call_kwargs("fsdp1", "FullyShardedDataParallel", fn, (self, *args), kwargs, first=1)
        try:
            fn(self, *args, **kwargs)
        except BaseException as exc:
            patch.hide_wrapper(exc)
            raise

    return __init__


# -- model.no_sync() on all but the last micro-step -----------------------------------------
def ddp_sync(micro: int) -> bool | None:
    """Whether DDP all-reduces on this micro-step (``micro``: forwards since the last optimizer step,
    from 0): only the last of every ``every``, as ``no_sync()`` on the others would; None when the
    trial sets nothing here. Called by the DDP hook before each training forward."""
    return _ddp_sync(micro)


@guarded("apply no_sync fix")
def _ddp_sync(micro: int) -> bool | None:
    o = _overrides
    every = o.ddp_sync.get("every") if o is not None else None
    if o is None or not isinstance(every, int) or every < 2:
        return None
    if o.said.get("model.no_sync", 0) < 1:
        _emit("model.no_sync", {"every": every}, {"every": 1}, {})
    return micro % every == every - 1
