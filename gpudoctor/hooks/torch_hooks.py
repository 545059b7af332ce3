"""Hooks into PyTorch: data wait, batch production, steps, saves, padding, settings."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from gpudoctor.hooks import patch
from gpudoctor.hooks.profiler_windows import ProfilerWindows
from gpudoctor.hooks.writer import EventWriter

# Padding is counted on every batch up to this many, then on every 10th.
_PAD_EVERY_BATCH_UNTIL = 5000


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
        self.windows = ProfilerWindows(writer)

    # -- install / remove -----------------------------------------------------
    def install_dataloader(self, mod: ModuleType) -> None:
        base = mod._BaseDataLoaderIter
        patch.replace(base, "__next__", self._wrap_next)
        patch.replace(base, "__init__", self._wrap_iter_init)

    def install_fetch(self, mod: ModuleType) -> None:
        for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            cls = getattr(mod, name, None)
            if cls is not None:
                patch.replace(cls, "fetch", patch.counted(self.writer, "fetch"))

    def install_save(self, torch: ModuleType) -> None:
        make = patch.span(self.writer, "checkpoint", "torch.save")
        patch.replace(torch, "save", make)
        serialization = sys.modules.get("torch.serialization")
        if serialization is not None:
            patch.replace(serialization, "save", make)

    def install_optimizer(self, optim_mod: ModuleType) -> None:
        self._handles.append(optim_mod.register_optimizer_step_pre_hook(self._on_step_pre))
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._on_step_post))

    def install_module(self, module_mod: ModuleType) -> None:
        self._forward_handle = module_mod.register_module_forward_pre_hook(self._on_forward_pre)

    def remove_handles(self) -> None:
        self.windows.stop()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._drop_forward_hook()

    def _drop_forward_hook(self) -> None:
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None

    # -- DataLoader -------------------------------------------------------------
    def _wrap_iter_init(self, fn: Any) -> Any:
        hooks = self

        def __init__(self_it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            fn(self_it, loader, *args, **kwargs)
            if id(loader) not in hooks._seen_loaders:
                hooks._seen_loaders.add(id(loader))
                hooks.writer.emit(_loader_event(loader))

        return __init__

    def _wrap_next(self, fn: Any) -> Any:
        hooks = self

        def __next__(self_it: Any) -> Any:
            if not hooks.first_step_seen:
                hooks.mark_first_step()
            t0 = time.time()
            p0 = time.perf_counter()
            try:
                batch = fn(self_it)
            finally:
                hooks.writer.emit({"k": "span", "c": "data_wait", "t0": t0, "dt": time.perf_counter() - p0, "name": "DataLoader.__next__"})
            if patch.depth("eval") == 0:
                hooks.batches += 1
                if hooks.batches <= _PAD_EVERY_BATCH_UNTIL or hooks.batches % 10 == 0:
                    hooks._count_padding(batch)
            return batch

        return __next__

    def mark_first_step(self) -> None:
        self.first_step_seen = True
        self.writer.cut_counters()  # tokenizer time before the first step stays on that side
        self.writer.emit({"k": "first_step", "t": time.time()})

    def _count_padding(self, batch: Any) -> None:
        event = padding_event(batch, self.pad_token_id)
        if event is not None:
            self.writer.emit(event)

    # -- steps ----------------------------------------------------------------------
    def _on_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_p0 = time.perf_counter()

    def explicit_step(self) -> None:
        """``gpudoctor.step()``: from now on the user marks steps, not optimizer.step."""
        self._explicit = True
        self._record_step(0.0)

    def _on_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if patch.depth("eval") or self._explicit:
            return
        self._record_step(time.perf_counter() - self._step_p0)

    def _record_step(self, dt: float) -> None:
        self.steps += 1
        if not self.first_step_seen:
            self.mark_first_step()
        self.writer.emit({"k": "step", "t": time.time(), "n": self.steps, "dt": dt})
        self.windows.on_step(self.steps)

    def _on_forward_pre(self, module: Any, args: Any) -> None:
        if self._cfg_done or not module.training:
            return
        torch = sys.modules["torch"]
        if not torch.is_grad_enabled():
            return
        self._cfg_done = True
        if not self.first_step_seen:
            self.mark_first_step()
        self.writer.emit(torch_cfg_event(torch, module))
        # Only needed once: drop the global hook so later forwards pay nothing.
        self._drop_forward_hook()


def _loader_event(loader: Any) -> dict[str, Any]:
    import inspect

    try:
        params = [p for p in inspect.signature(type(loader).__init__).parameters if p != "self"]
    except (TypeError, ValueError):
        params = []
    return {
        "k": "loader",
        "t": time.time(),
        "id": id(loader),
        "num_workers": getattr(loader, "num_workers", None),
        "batch_size": getattr(loader, "batch_size", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "dataset": type(getattr(loader, "dataset", None)).__name__,
        "collate_fn": getattr(getattr(loader, "collate_fn", None), "__name__", None)
        or type(getattr(loader, "collate_fn", None)).__name__,
        "params": params,
        "pid": os.getpid(),
    }


def padding_event(batch: Any, pad_token_id: int | None) -> dict[str, Any] | None:
    """Count pad tokens from the batch itself: attention mask, else pad id in input_ids."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(batch, Mapping):
        return None
    mask = batch.get("attention_mask")
    ids = batch.get("input_ids")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.device.type == "cpu":
        lengths = mask.ne(0).sum(dim=1)
    elif isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.device.type == "cpu" and pad_token_id is not None:
        lengths = ids.ne(pad_token_id).sum(dim=1)
        mask = ids
    else:
        return None
    rows, seq_len = mask.shape
    tokens = rows * seq_len
    real = int(lengths.sum())
    return {"k": "batch", "t": time.time(), "tokens": tokens, "pad": tokens - real, "seq_len": int(seq_len), "lengths": lengths.tolist()}


def torch_cfg_event(torch: ModuleType, module: Any) -> dict[str, Any]:
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
        "module": type(module).__name__,
        "libs": {name: getattr(sys.modules.get(name), "__version__", None) for name in ("torch", "transformers", "datasets", "accelerate") if name in sys.modules},
    }
