"""Hooks into PyTorch: data wait, batch production, steps, saves, padding, settings.

Every body of ours is :func:`gpudoctor.hooks.guard.guarded`; see there why.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, cast

from gpudoctor.common import batchlengths
from gpudoctor.common.redact import redact_mapping, redact_value
from gpudoctor.core.events import (
    NO_BATCH_WAIT,
    SIDE_FILE,
    BatchEvent,
    Event,
    LoaderEvent,
    ModelEvent,
    TorchCfgEvent,
)
from gpudoctor.hooks import apply, dataset_items, patch
from gpudoctor.hooks.cuda_memory import AllocatorLines, CudaMemory, DeviceMemory
from gpudoctor.hooks.device_clock import DeviceClock, GpuMarks
from gpudoctor.hooks.guard import guarded, hooks_but_ours, untraced
from gpudoctor.hooks.profiler_windows import ProfilerWindows
from gpudoctor.hooks.writer import EventWriter

# Padding is counted on every batch up to this many, then on every 10th.
_PAD_EVERY_BATCH_UNTIL = 5000


_SAVE = "checkpoint save"  # the writer's hold key for the last checkpoint save's span
_ROTATED = "checkpoint save, rotated"  # the same, extended over removals that follow it


class _Held:
    """A writer for :func:`patch.span` that holds its event back under ``key`` (see EventWriter.hold)."""

    def __init__(self, writer: EventWriter, key: str) -> None:
        self.writer, self.key = writer, key

    def emit(self, event: Event) -> None:
        self.writer.hold(self.key, event)


class TorchHooks:
    """State shared by the torch patches of one process."""

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.first_step_seen = False
        self.steps = 0
        self.batches = 0
        self.pad_token_id: int | None = None
        self._seen_loaders: set[int] = set()
        self._handles: list[Any] = []
        self._forward_handle: Any = None
        self._step_p0 = 0.0
        self._cfg_done = False
        self._explicit = False
        self._save_began: tuple[float, float] | None = None  # the last checkpoint save, until a step
        self.windows = ProfilerWindows(writer)
        self.gpu: GpuMarks | None = None  # CUDA events, once the first training forward runs on CUDA
        self.allocator: AllocatorLines | None = None  # the CUDA allocator's counters, from then too
        self.comm: Any = None  # the CommHooks (collectives per step), set by install

    # -- install / remove -----------------------------------------------------
    def install_dataloader(self, mod: ModuleType) -> None:
        base = mod._BaseDataLoaderIter
        patch.replace(base, "__next__", self._wrap_next)
        patch.replace(base, "__init__", self._wrap_iter_init)

    def install_fetch(self, mod: ModuleType) -> None:
        for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            cls = getattr(mod, name, None)
            if cls is not None:
                patch.replace(cls, "fetch", patch.counted_cpu(self.writer, "fetch"))

    def install_save(self, torch: ModuleType) -> None:
        """``torch.save`` as a checkpoint span, or a ``save_side`` span for a file without tensors
        (``training_args.bin``, a config): timed as saving, never counted as a checkpoint."""
        # held, not written: an os.fsync/remove that follows before the next step extends it (_save_tail)
        as_checkpoint = patch.span(cast(EventWriter, _Held(self.writer, _SAVE)), "checkpoint", "torch.save")
        as_side = patch.span(self.writer, SIDE_FILE, "torch.save (no tensors)")

        def make(fn: Any) -> Any:
            checkpoint, side = as_checkpoint(fn), as_side(fn)

            def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if _holds_no_tensors(obj):
                    return side(obj, *args, **kwargs)
                target = args[0] if args else kwargs.get("f")
                if apply.active() and apply.skip_save():  # ``gpudoctor try`` thins the loop's saves
                    apply.stand_in(target)  # ...leaving the last real checkpoint at the path it asked for
                    return None
                outer = patch.depth("checkpoint") == 0  # not inside a framework's save (Lightning's)
                if outer:
                    self._end_save()  # the previous save is final: a new one begins
                began = (time.time(), time.perf_counter())
                if self.gpu is not None:
                    self._gpu_save(began[0])
                try:
                    out = checkpoint(obj, *args, **kwargs)
                finally:
                    if self.gpu is not None:
                        self._gpu_save(None)
                self._save_began = began if outer else None  # a framework's save times its own end
                if apply.active():
                    apply.saved(target)
                return out

            return save

        patch.replace(torch, "save", make)
        for name in ("fsync", "remove", "unlink"):  # finishing the save, rotating old checkpoints
            patch.replace(os, name, self._wrap_fsync)
        serialization = sys.modules.get("torch.serialization")
        if serialization is not None:
            patch.replace(serialization, "save", make)

    def _wrap_fsync(self, fn: Any) -> Any:
        """``os.fsync`` (or ``os.remove``/``os.unlink``, rotating old checkpoints) after a checkpoint
        ``torch.save`` and before the next step is part of that save: the save's span is extended to
        its end (one save, held until the next step and written once), so a loop that saves to an open
        file, fsyncs it and deletes the oldest is timed whole. A removal counts only once a step
        follows: files removed when training is over (a temporary folder's cleanup) are no save.
        Any other call is left alone, at the cost of one attribute read."""
        hooks = self
        rotation = getattr(fn, "__name__", "") in ("remove", "unlink")

        def fsync(*args: Any, **kwargs: Any) -> Any:
            began = hooks._save_began
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            finally:
                if began is not None:
                    hooks._save_tail(began, rotation)

        return fsync

    @guarded("GPU clock: saves")
    def _gpu_save(self, t0: float | None) -> None:
        """The save's marks on the GPU clock: ``t0`` at its start, None at its end."""
        if self.gpu is not None:
            if t0 is not None:
                self.gpu.save_start(t0)
            else:
                self.gpu.save_end()

    @guarded("save timing")
    def _save_tail(self, began: tuple[float, float], rotation: bool) -> None:
        event: Event = {"k": "span", "c": "checkpoint", "t0": began[0], "dt": time.perf_counter() - began[1],
                        "name": "torch.save + os.fsync/remove"}
        if rotation:  # counts once a step follows (_end_save)
            self.writer.hold(_ROTATED, event, at_exit=False)
        else:
            self.writer.hold(_SAVE, event)
            self.writer.drop(_ROTATED)  # the fsync's span covers it

    def _end_save(self) -> None:
        """The last save is over (a step, or a new save): write its span once, rotation included."""
        self.writer.release(_ROTATED if self.writer.holds(_ROTATED) else _SAVE)
        self.writer.drop(_SAVE)

    def install_optimizer(self, optim_mod: ModuleType) -> None:
        self._handles.append(optim_mod.register_optimizer_step_pre_hook(self._on_step_pre))
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._on_step_post))

    def install_module(self, module_mod: ModuleType) -> None:
        self._forward_handle = module_mod.register_module_forward_pre_hook(untraced(self._on_forward_pre))
        if callable(getattr(module_mod, "_has_any_global_hook", None)):
            patch.replace(module_mod, "_has_any_global_hook", hooks_but_ours)

    def keep_handles(self, *handles: Any) -> None:
        """Handles registered by another hook module, removed with ours on detach."""
        self._handles.extend(handles)

    def remove_handles(self) -> None:
        self.windows.stop()
        if self.gpu is not None:
            self._gpu_read_back()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._drop_forward_hook()

    def _drop_forward_hook(self) -> None:
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None

    # -- DataLoader -------------------------------------------------------------
    # The wrappers call the loader's own method exactly once, outside any guard; only
    # the bookkeeping around it is guarded, so its batches and exceptions are untouched.
    def _wrap_iter_init(self, fn: Any) -> Any:
        hooks = self

        def __init__(self_it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            try:
                fn(self_it, loader, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            hooks._on_iter_init(loader)

        return __init__

    @guarded("DataLoader settings")
    def _on_iter_init(self, loader: Any) -> None:
        if id(loader) not in self._seen_loaders:
            self._seen_loaders.add(id(loader))
            event = _loader_event(loader)
            dataset = safe_attr(loader, "dataset")
            event["item_keys"], event["item_libs"] = dataset_items.describe(dataset)
            lengths = _table_lengths(dataset)
            if lengths is not None:
                event["length_edges"], event["length_counts"] = lengths
            self.writer.emit(event)

    def _wrap_next(self, fn: Any) -> Any:
        hooks = self
        wall, perf = time.time, time.perf_counter

        def __next__(self_it: Any) -> Any:
            if not hooks.first_step_seen:
                hooks.mark_first_step()
            t0 = wall()
            p0 = perf()
            if hooks.gpu is not None:
                hooks._gpu_wait_start(t0)
            try:
                batch = fn(self_it)
            except BaseException as exc:  # StopIteration included: the last wait counts too
                patch.hide_wrapper(exc)
                hooks._waited(t0, p0)
                raise
            hooks._fetched(t0, p0, batch)
            return batch

        return __next__

    @guarded("DataLoader wait", vital=True)
    def _waited(self, t0: float, p0: float) -> None:
        """A wait that ended without a batch (the end of the data): data wait, not a batch."""
        self.writer.emit({"k": "span", "c": "data_wait", "t0": t0, "dt": time.perf_counter() - p0,
                          "name": NO_BATCH_WAIT})
        if self.gpu is not None:
            self._gpu_wait_end()

    @guarded("GPU clock: waits")
    def _gpu_wait_start(self, t0: float) -> None:
        if self.gpu is not None and patch.depth("eval") == 0:
            self.gpu.wait_start(t0)

    @guarded("GPU clock: waits")
    def _gpu_wait_end(self) -> None:
        if self.gpu is not None:
            self.gpu.wait_end()

    @guarded("GPU clock: read back")
    def _gpu_read_back(self) -> None:
        """What the GPU has passed so far (a detach, an uninstall): marks still queued are left."""
        if self.gpu is not None:
            self.gpu.poll()

    @guarded("GPU clock: steps")
    def _gpu_step(self) -> None:
        if self.gpu is not None:
            self.gpu.step_end(self.steps)

    def start_gpu_clock(self, device: str = "cuda", clock: DeviceClock | None = None,
                        memory: DeviceMemory | None = None) -> None:
        """CUDA events and the allocator's counters from now on (``clock``, ``memory``: a fake device
        clock and allocator in tests; with a fake clock and no ``memory``, no allocator lines)."""
        if self.gpu is None:
            self.gpu = _start_gpu_clock(self.writer, device, clock)
        if self.allocator is None and (memory is not None or clock is None):
            self.allocator = _start_allocator(self.writer, memory)

    @guarded("CUDA allocator")
    def _allocator_step(self) -> None:
        if self.allocator is not None:
            self.allocator.step_end(self.steps)

    @guarded("DataLoader wait", vital=True)
    def _fetched(self, t0: float, p0: float, batch: Any) -> None:
        self.writer.emit({"k": "span", "c": "data_wait", "t0": t0, "dt": time.perf_counter() - p0,
                          "name": "DataLoader.__next__"})
        if self.gpu is not None:
            self._gpu_wait_end()
        if patch.depth("eval") == 0:
            self.batches += 1
            if self.batches <= _PAD_EVERY_BATCH_UNTIL or self.batches % 10 == 0:
                self._count_padding(batch)

    @guarded("first step", vital=True)
    def mark_first_step(self) -> None:
        self.first_step_seen = True
        self.writer.cut_counters()  # tokenizer time before the first step stays on that side
        self.writer.emit({"k": "first_step", "t": time.time()})

    @guarded("padding count")
    def _count_padding(self, batch: Any) -> None:
        if not self.writer.enabled:
            return
        event = padding_event(batch, self.pad_token_id)
        if event is not None:
            self.writer.emit(event)

    # -- steps ----------------------------------------------------------------------
    @guarded("optimizer steps", vital=True)
    def _on_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_p0 = time.perf_counter()

    def _on_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Registered with torch: the step (vital), then the profiler window.

        The window is stepped outside the step's guard so that one open when
        recording stops still closes on time, on this thread.
        """
        if self._step_post() or self.windows.open:
            self.windows.on_step()

    @guarded("optimizer steps", vital=True, default=False)
    def _step_post(self) -> bool:
        if patch.depth("eval") or self._explicit:
            return False
        self._record_step(time.perf_counter() - self._step_p0)
        return True

    def explicit_step(self) -> None:
        """``gpudoctor.step()``: from now on the user marks steps, not optimizer.step."""
        if self._explicit_step() or self.windows.open:
            self.windows.on_step()

    @guarded("optimizer steps", vital=True, default=False)
    def _explicit_step(self) -> bool:
        self._explicit = True
        self._record_step(0.0)
        return True

    def record_step_at(self, t: float) -> None:
        """A parameter update made without an optimizer (see eval_regions): a step at ``t``."""
        if not self._explicit:
            self._record_step(0.0, t)

    def _record_step(self, dt: float, t: float | None = None) -> None:
        self.steps += 1
        self._save_began = None
        self._end_save()  # the last save's span is final: written before this step
        if not self.first_step_seen:
            self.mark_first_step()
        now = time.time() if t is None else t
        self.writer.emit({"k": "step", "t": now, "n": self.steps, "dt": dt})
        if self.comm is not None:
            self.comm.step_end(self.steps, now)
        if self.gpu is not None:
            self._gpu_step()
        if self.allocator is not None:
            self._allocator_step()

    @guarded("precision settings")
    def _on_forward_pre(self, module: Any, args: Any) -> None:
        if self._cfg_done or not module.training:
            return
        torch = sys.modules["torch"]
        if not torch.is_grad_enabled():
            return
        # Only needed once: drop the global hook first, so later forwards pay nothing even
        # if reading the settings below fails.
        self._cfg_done = True
        self._drop_forward_hook()
        if not self.first_step_seen:
            self.mark_first_step()
        cfg = torch_cfg_event(torch, module)
        self.writer.emit(cfg)
        _emit_model(self.writer, module, args)
        if cfg["device"] == "cuda" and cfg["cuda"]:
            self.start_gpu_clock()


@guarded("GPU clock", default=None)
def _start_gpu_clock(writer: EventWriter, device: str, clock: DeviceClock | None) -> GpuMarks | None:
    from gpudoctor.hooks import cuda_clock

    return cuda_clock.start(writer, device, clock)


@guarded("CUDA allocator", default=None)
def _start_allocator(writer: EventWriter, memory: DeviceMemory | None) -> AllocatorLines | None:
    return AllocatorLines(memory if memory is not None else CudaMemory(sys.modules["torch"]), writer.emit)


_WALK_MAX = 10_000  # objects looked at before calling a save a checkpoint anyway


@guarded("save kinds", default=False)
def _holds_no_tensors(obj: Any) -> bool:
    """Does ``obj`` hold no tensor, module or optimizer state (a side file, not a checkpoint)?"""
    torch = sys.modules["torch"]
    todo, seen = [obj], 0
    while todo:
        item = todo.pop()
        seen += 1
        if seen > _WALK_MAX or isinstance(item, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
            return False
        if isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            todo.extend(item)
    return True


def safe_attr(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)`` that also survives a ``__getattr__`` raising anything."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _loader_event(loader: Any) -> LoaderEvent:
    """The loader's settings; never raises (``attach`` calls it on live loaders)."""
    import inspect

    try:
        params = [p for p in inspect.signature(type(loader).__init__).parameters if p != "self"]
    except Exception:
        params = []
    collate = safe_attr(loader, "collate_fn")
    name = safe_attr(collate, "__name__")
    return {
        "k": "loader",
        "t": time.time(),
        "id": id(loader),
        "num_workers": safe_attr(loader, "num_workers"),
        "batch_size": safe_attr(loader, "batch_size"),
        "pin_memory": safe_attr(loader, "pin_memory"),
        "prefetch_factor": safe_attr(loader, "prefetch_factor"),
        "persistent_workers": safe_attr(loader, "persistent_workers"),
        "dataset": redact_value(type(safe_attr(loader, "dataset")).__name__),
        "dataset_len": _dataset_len(safe_attr(loader, "dataset")),
        "collate_fn": redact_value(name if isinstance(name, str) and name else type(collate).__name__),
        "params": params,
        "pid": os.getpid(),
    }


def _dataset_len(dataset: Any) -> int | None:
    """``len(dataset)`` for a map-style dataset (a worker count past its batches is idle); None for
    an iterable one or when it cannot say."""
    torch_data = sys.modules.get("torch.utils.data")
    iterable = getattr(torch_data, "IterableDataset", None)
    if dataset is None or (iterable is not None and isinstance(dataset, iterable)):
        return None
    try:
        n = len(dataset)
    except Exception:
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


_MODEL_CONFIG_KEYS = 200  # a real config has ~50 sizes and switches; beyond that, not a model config


@guarded("model config")
def _emit_model(writer: EventWriter, module: Any, args: Any = ()) -> None:
    """The trained model's config (sizes only) and its shape from its parameters, once.

    Only numbers, switches and ``model_type`` of a ``PretrainedConfig``-like ``config.to_dict()``
    are kept (no paths, names or nested values), and those pass through the redactor too. The
    shape (:func:`model_shape`) is what the workload model needs when there is no config; for a
    model with convolutions, its layers in order and the first forward's image batch shape (``args``:
    the shape only, no value read) are what a stand-in of its compute is built from.
    """
    to_dict = safe_attr(safe_attr(module, "config"), "to_dict")
    raw = to_dict() if callable(to_dict) else None
    sizes = {k: v for k, v in raw.items() if isinstance(k, str) and (
        isinstance(v, (int, bool)) or (isinstance(v, float) and math.isfinite(v))
        or (k == "model_type" and isinstance(v, str)))} if isinstance(raw, dict) else {}
    sizes_of = [_dims(p) for p in module.parameters()]  # metadata only: no tensor is read
    # a lazy module's weights have no size before the first forward: the count is then unknown
    params = None if any(d is None for d in sizes_of) else sum(math.prod(d) for d in sizes_of if d is not None)
    event: ModelEvent = {"k": "model", "t": time.time(), "class": redact_value(type(module).__name__),
                         "params": params,
                         "config": redact_mapping(dict(list(sizes.items())[:_MODEL_CONFIG_KEYS]))}
    shape = model_shape(module)
    if shape and "layers" in shape:
        first = args[0] if isinstance(args, tuple) and args else None
        size = getattr(first, "shape", None) if type(first).__name__ in ("Tensor", "Parameter") else None
        if size is not None and len(size) == 4:
            shape["input"] = [int(n) for n in size]
    if shape:
        event["shape"] = shape
    writer.emit(event)


_ATTENTION_NAMES = ("attn", "attention", "qkv", "q_proj", "query")
_MAX_LAYERS = 256  # a convolutional model's layers kept in order, at most (a ResNet-152 has about 210)
_MATMUL_TYPES = ("Linear", "Conv1D", "NonDynamicallyQuantizableLinear")
_WALK_MODULES = 20_000  # a model with more submodules is walked this far


@guarded("model shape")
def model_shape(module: Any) -> dict[str, Any] | None:
    """Sizes of the FLOPs model from the parameter shapes: one walk of the modules, at the first
    forward only. ``matmul_params``: weights of Linear-like layers (shared ones once);
    ``n_layers``: the longest list of same-type blocks; ``hidden``: the most common layer width;
    ``attention``: whether a submodule is named like an attention (None: cannot tell). A model
    with 2-D convolutions also gets ``layers``: its convolutions, pools, batch norms and linear
    layers in module order (:func:`_layer`), what a stand-in of its compute replays."""
    seen: set[int] = set()
    matmul = 0
    widths: dict[int, int] = {}
    layers = 0
    attention = False
    ordered: list[list[Any]] = []
    convs = False
    for i, (name, sub) in enumerate(module.named_modules()):
        if i > _WALK_MODULES:
            break
        kind = type(sub).__name__
        layer = _layer(kind, sub) if len(ordered) < _MAX_LAYERS else None
        if layer is not None:
            ordered.append(layer)
            convs = convs or layer[0] == "conv"
        leaf = name.rsplit(".", 1)[-1].lower()
        attention = attention or any(a in leaf for a in _ATTENTION_NAMES) or kind == "MultiheadAttention"
        if kind in _MATMUL_TYPES or kind.endswith("Linear"):
            weight = safe_attr(sub, "weight")
            shape = _dims(weight) or ()
            if len(shape) == 2 and id(weight) not in seen:
                seen.add(id(weight))
                matmul += int(shape[0]) * int(shape[1])
                width = min(int(shape[0]), int(shape[1]))
                widths[width] = widths.get(width, 0) + 1
        elif kind in ("ModuleList", "Sequential"):
            children = list(sub.children())
            if len(children) > layers and len({type(c) for c in children}) == 1:
                layers = len(children)
    out: dict[str, Any] = {}
    if matmul and widths:
        hidden = max(widths, key=lambda w: (widths[w], w))
        out = {"matmul_params": matmul, "n_layers": max(1, layers), "hidden": hidden,
               "attention": True if attention else None}
    if convs:
        out["layers"] = ordered
    return out or None


def _layer(kind: str, sub: Any) -> list[Any] | None:
    """One layer of a convolutional model, in plain numbers: ``["conv", in, out, kh, kw, sh, sw, ph,
    pw, dh, dw, groups]``, ``["pool", "max"|"avg", kh, kw, sh, sw, ph, pw]``, ``["adaptive", oh, ow]``,
    ``["norm", channels]``, ``["linear", in, out]``; None for any other module (activations cost
    little, containers hold the rest). Read from the module's settings, never its tensors."""
    if kind.endswith("Conv2d"):
        shape = _dims(safe_attr(sub, "weight")) or ()
        nums = [_pair(safe_attr(sub, k)) for k in ("kernel_size", "stride", "dilation")]
        pad = safe_attr(sub, "padding")
        if len(shape) != 4 or any(n is None for n in nums):
            return None
        (kh, kw), (sh, sw), (dh, dw) = nums  # type: ignore[misc]
        padding = (((kh - 1) * dh // 2, (kw - 1) * dw // 2) if pad == "same" else (0, 0) if pad == "valid"
                   else _pair(pad))
        groups = safe_attr(sub, "groups")
        if padding is None or not isinstance(groups, int) or groups < 1:
            return None
        return ["conv", int(shape[1]) * groups, int(shape[0]), kh, kw, sh, sw, *padding, dh, dw, groups]
    if kind in ("MaxPool2d", "AvgPool2d"):
        nums = [_pair(safe_attr(sub, k)) for k in ("kernel_size", "stride", "padding")]  # torch sets stride
        if any(n is None for n in nums):
            return None
        return ["pool", "max" if kind.startswith("Max") else "avg", *nums[0], *nums[1], *nums[2]]  # type: ignore[misc]
    if kind in ("AdaptiveAvgPool2d", "AdaptiveMaxPool2d"):
        size = _pair(safe_attr(sub, "output_size"))
        return ["adaptive", *size] if size is not None else None
    if kind == "BatchNorm2d":
        channels = safe_attr(sub, "num_features")
        return ["norm", channels] if isinstance(channels, int) and channels > 0 else None
    if kind == "Linear":
        shape = _dims(safe_attr(sub, "weight")) or ()
        return ["linear", int(shape[1]), int(shape[0])] if len(shape) == 2 else None
    return None


def _dims(tensor: Any) -> tuple[int, ...] | None:
    """A tensor's sizes, or None where it has none yet (a lazy module's weight raises on ``.shape``)."""
    try:
        return tuple(int(n) for n in tensor.shape)
    except Exception:
        return None


def _pair(value: Any) -> tuple[int, int] | None:
    """An int or a pair of ints (none negative) as a pair; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        return int(value[0]), int(value[1])
    return None


def padding_event(batch: Any, pad_token_id: int | None) -> BatchEvent | None:
    """Count pad tokens from the batch itself: attention mask, else pad id in input_ids.

    Only plain (strided) 2-D CPU tensors are counted: sparse, mkldnn, nested,
    quantized or meta ones are left alone rather than densified on the hot path.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(batch, Mapping):
        return None
    mask: Any = batch.get("attention_mask")  # the user's batch: whatever its collate made
    ids: Any = batch.get("input_ids")
    if _countable(torch, mask):
        lengths = mask.count_nonzero(dim=1).tolist()  # one kernel, no temporary mask: ~20 -> ~13 us a batch
    elif _countable(torch, ids) and pad_token_id is not None:
        lengths = ids.ne(pad_token_id).sum(dim=1).tolist()
        mask = ids
    else:
        return None
    rows, seq_len = mask.shape
    tokens = rows * seq_len
    event: BatchEvent = {"k": "batch", "t": time.time(), "tokens": tokens, "pad": tokens - sum(lengths), "seq_len": int(seq_len),
             "lengths": lengths}
    return cast(BatchEvent, batchlengths.bound(dict(event)))  # a 1 M-row batch: a sample of lengths, exact rows/max/sum, not a 2 MB line


def _countable(torch: ModuleType, t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_quantized
            and not t.is_nested and t.dim() == 2 and t.device.type == "cpu")


@guarded("dataset row lengths", default=None)
def _table_lengths(dataset: Any) -> tuple[list[int], list[int]] | None:
    return dataset_items.row_lengths(dataset)


def torch_cfg_event(torch: ModuleType, module: Any) -> TorchCfgEvent:
    cuda = bool(torch.cuda.is_available())
    param = next(module.parameters(), None) if hasattr(module, "parameters") else None
    device_type = param.device.type if param is not None else ("cuda" if cuda else "cpu")
    try:
        autocast = bool(torch.is_autocast_enabled(device_type))
        autocast_dtype = str(torch.get_autocast_dtype(device_type)) if autocast else None
    except (TypeError, AttributeError, RuntimeError):
        autocast, autocast_dtype = bool(torch.is_autocast_enabled()), None
    return {
        "k": "torch_cfg",
        "t": time.time(),
        "cuda": cuda,
        "device": device_type,
        "device_name": torch.cuda.get_device_name() if cuda and device_type == "cuda" else None,
        "device_capability": list(torch.cuda.get_device_capability()) if cuda and device_type == "cuda" else None,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "param_dtype": str(param.dtype) if param is not None else None,
        "autocast": autocast,
        "autocast_dtype": autocast_dtype,
        "threads": int(torch.get_num_threads()),
        "module": redact_value(type(module).__name__),
        "libs": redact_mapping({name: getattr(sys.modules.get(name), "__version__", None)
                                for name in ("torch", "transformers", "datasets", "accelerate")
                                if name in sys.modules}),
    }
