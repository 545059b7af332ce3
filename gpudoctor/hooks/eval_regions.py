"""Evaluation in hand-written loops, and parameter updates done without an optimizer.

``Trainer.evaluate`` and Lightning's validation loop mark their evals themselves;
a hand-written loop (nanoGPT's ``estimate_loss()``) does not, so its eval forward
passes were counted as compute. Here an eval region is found from what every such
loop does: forward passes of a trained model (one with parameters that require
grad) under ``torch.no_grad()`` / ``torch.inference_mode()`` or in ``.eval()`` mode,
with no backward among them.

* Inside an outermost ``no_grad``/``inference_mode`` block on the main thread, a
  forward pass and no backward make the whole block an eval region (batch
  fetches and loss bookkeeping included): ``@torch.no_grad() def estimate_loss``.
* Outside such a block (``model.eval()`` with grad on, ``set_grad_enabled(False)``,
  or a block entered before ``attach``), the region runs from the first such
  forward to the end of the last one, and ends at the next training forward,
  optimizer step or backward. A backward right after an eval-mode forward with
  grad on means training in eval mode (dropout off): that region is dropped.

Cost: torch runs a module's forward on its fast path only while no global forward
hook exists, so the global pre/post hooks live only until the first optimizer step.
By then the top-level modules that ran a training forward are known (and what they
wrap: DDP's ``.module``, ``torch.compile``'s ``_orig_mod``), held by weak reference;
from then on the global hooks are in only while an eval can happen: inside an
outermost ``no_grad``/``inference_mode`` block, or while one of those models is in
eval mode (``Module.train`` is patched on torch's class to know). Training forwards
run on the fast path, and only those models' forwards count. An eval before the first
step (nanoGPT evaluates at iteration 0) is seen by the global hooks as before.

Nothing goes on the user's modules (issue #39): a hook of ours on a model made it
unpicklable (``torch.save(model)``, ``copy.deepcopy`` for an EMA: our bound methods hold
the writer's locks), and ``torch.jit.script`` compiles a module's hooks with it.

Regions are ``eval_loop`` spans (their forward passes an ``eval_forwards`` counter); the analysis counts them as eval only in a
process that trains (steps seen), so an inference script is not "all eval".

A ``no_grad`` block with no forward right after a backward, in a process that has
never stepped an optimizer, is a hand-written parameter update
(``p -= lr * p.grad``): it is recorded as a step, so such a loop has steps too.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from types import ModuleType
from typing import Any

from gpudoctor.core.events import EVAL_FORWARDS, EVAL_LOOP
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded, untraced
from gpudoctor.hooks.torch_hooks import TorchHooks, safe_attr
from gpudoctor.hooks.writer import EventWriter

SPAN = EVAL_LOOP
FORWARDS = EVAL_FORWARDS  # counter: forward passes inside eval regions
_Stamp = tuple[float, float]  # (time.time(), time.perf_counter())


def _now() -> _Stamp:
    return time.time(), time.perf_counter()


class EvalRegions:
    """Per-process state, main thread only (where training loops run)."""

    def __init__(self, writer: EventWriter, torch_hooks: TorchHooks) -> None:
        self.writer = writer
        self.th = torch_hooks
        self._main = threading.main_thread().ident
        self._torch: Any = None
        self._depth = 0  # module call depth: only top-level forwards count
        self._ctx_depth = 0  # outermost no_grad / inference_mode blocks
        self._ctx_t0: _Stamp | None = None
        self._ctx_forwards = 0
        self._ctx_backward = False
        self._region: _Stamp | None = None  # open region outside a block: its first forward
        self._region_end = 0.0  # perf time the last forward of that region ended
        self._region_grad = False  # a forward in it ran with grad on
        self._region_forwards = 0
        self._backward_since_step = False
        self._optimizer_seen = False
        self._pending_update: float | None = None  # time.time() of an update not yet counted
        self._global: list[Any] = []  # the global forward hooks: until the first step, then while armed
        self._tops: dict[int, Any] = {}  # top-level modules that ran a training forward (until the first step)
        self._narrowed = False  # the first step came: only the tracked models count
        self._tracked: dict[int, weakref.ref[Any]] = {}  # ... those models, never kept alive by us
        self._in_eval: set[int] = set()  # tracked models now in eval mode
        self._module_mod: Any = None

    # -- install -----------------------------------------------------------------
    def install(self, torch: ModuleType) -> None:
        self._torch = torch
        grad_mode = sys.modules.get("torch.autograd.grad_mode")
        for cls in (getattr(grad_mode, "no_grad", None), getattr(grad_mode, "inference_mode", None)):
            if cls is not None:
                patch.replace(cls, "__enter__", self._wrap_enter)
                patch.replace(cls, "__exit__", self._wrap_exit)
        autograd = sys.modules.get("torch.autograd")
        if autograd is not None:
            patch.replace(autograd, "backward", self._wrap_backward)
        module_mod = self._module_mod = sys.modules["torch.nn.modules.module"]
        patch.replace(module_mod.Module, "train", self._wrap_train)
        optim = sys.modules.get("torch.optim.optimizer")
        self._arm()
        if optim is not None:
            self.th.keep_handles(optim.register_optimizer_step_pre_hook(self._on_step))

    def _arm(self) -> None:
        if not self._global:
            self._depth = 0
            among = self._tracked if self._narrowed else None  # after the first step: the trained models only
            self._global = [self._module_mod.register_module_forward_pre_hook(untraced(self._pre, among)),
                            self._module_mod.register_module_forward_hook(untraced(self._post, among),
                                                                          always_call=True)]

    def _disarm(self) -> None:
        for handle in self._global:
            handle.remove()
        self._global = []

    def _rearm(self) -> None:
        """After the first step: global hooks only while an eval can happen."""
        if not self._narrowed:
            return
        if self._ctx_depth or self._in_eval:
            self._arm()
        elif self._global:
            self._disarm()
            self._close_region(self._region_end)

    @guarded("eval regions")
    def _narrow(self) -> None:
        """First step: note the trained models (weakly), then drop the global hooks until an eval can happen."""
        if self._narrowed or not self._tops:
            return
        torch = self._torch
        for top in self._tops.values():
            for m in (top, safe_attr(top, "module"), safe_attr(top, "_orig_mod")):
                if isinstance(m, torch.nn.Module):
                    self._tracked[id(m)] = weakref.ref(m)
                    if not m.training:
                        self._in_eval.add(id(m))
        self._narrowed, self._tops = True, {}
        self._disarm()
        self._rearm()

    def _is_tracked(self, module: Any) -> bool:
        ref = self._tracked.get(id(module))
        return ref is not None and ref() is module

    def _wrap_train(self, fn: Any) -> Any:
        regions = self

        def train(self_module: Any, mode: bool = True) -> Any:
            try:
                out = fn(self_module, mode)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            if regions._narrowed and not regions._torch.compiler.is_compiling():  # nothing of ours in a graph
                regions._mode_set(self_module, mode)
            return out

        return train

    @guarded("eval regions", vital=True)
    def _mode_set(self, module: Any, mode: Any) -> None:
        if threading.get_ident() != self._main or not self._is_tracked(module):
            return
        if mode:
            self._in_eval.discard(id(module))
        else:
            self._in_eval.add(id(module))
        self._rearm()

    # -- wrappers: the user's call exactly once, outside any guard ----------------
    def _wrap_enter(self, fn: Any) -> Any:
        regions = self

        def __enter__(self_ctx: Any) -> Any:
            try:
                result = fn(self_ctx)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            regions._entered()
            return result

        return __enter__

    def _wrap_exit(self, fn: Any) -> Any:
        regions = self

        def __exit__(self_ctx: Any, *exc: Any) -> Any:
            try:
                result = fn(self_ctx, *exc)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            regions._exited()
            return result

        return __exit__

    def _wrap_backward(self, fn: Any) -> Any:
        regions = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            regions._on_backward()
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise

        return backward

    # -- bookkeeping ---------------------------------------------------------------
    def _mine(self) -> bool:
        return threading.get_ident() == self._main and patch.depth("eval") == 0

    @guarded("eval regions", vital=True)
    def _entered(self) -> None:
        if not self._mine():
            return
        self._ctx_depth += 1
        if self._ctx_depth == 1:
            self._close_region(self._region_end)
            self._ctx_t0, self._ctx_forwards, self._ctx_backward = _now(), 0, False
            self._rearm()

    @guarded("eval regions", vital=True)
    def _exited(self) -> None:
        if not self._mine():
            return
        if self._ctx_depth == 0:  # a block entered before the hooks went in (attach)
            self._close_region(time.perf_counter())
            return
        self._ctx_depth -= 1
        if self._ctx_depth == 0:
            self._rearm()
        if self._ctx_depth or self._ctx_t0 is None:
            return
        t0, self._ctx_t0 = self._ctx_t0, None
        if self._ctx_forwards and not self._ctx_backward:
            self._emit(t0, time.perf_counter(), self._ctx_forwards)
        elif not self._ctx_forwards and self._backward_since_step and not self._optimizer_seen:
            self._pending_update = time.time()  # counted at the next forward or backward
            self._backward_since_step = False

    @guarded("eval regions", vital=True)
    def _on_backward(self) -> None:
        if not self._mine():
            return
        self._settle_update()
        self._backward_since_step = True
        if self._ctx_depth:
            self._ctx_backward = True
        elif self._region is not None:
            if self._region_grad:
                self._region = None  # forward in eval mode, then backward: training, not eval
            else:
                self._close_region(self._region_end)

    @guarded("eval regions", vital=True)
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self._main:
            return
        self._optimizer_seen = True
        self._pending_update = None
        self._backward_since_step = False
        self._close_region(self._region_end)
        if not self._narrowed:
            self._narrow()

    @guarded("eval regions", vital=True)
    def _pre(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._main or (self._narrowed and not self._is_tracked(module)):
            return
        self._depth += 1
        if self._depth != 1 or patch.depth("eval"):
            return
        torch = self._torch
        grad_on = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        if grad_on and module.training:  # a training forward ends any eval region
            if not self._narrowed and _trained(module):
                self._tops[id(module)] = module
            self._settle_update()
            self._close_region(self._region_end)
            return
        if not _trained(module):
            return  # a frozen model (a teacher, a metric network) is not the one being evaluated
        if self._ctx_depth:
            self._ctx_forwards += 1
        elif self._region is None:
            self._region, self._region_grad, self._region_forwards = _now(), grad_on, 1
        else:
            self._region_grad = self._region_grad or grad_on
            self._region_forwards += 1

    @guarded("eval regions", vital=True)
    def _post(self, module: Any, args: Any, output: Any) -> None:
        if threading.get_ident() != self._main or (self._narrowed and not self._is_tracked(module)):
            return
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._region is not None:
            self._region_end = time.perf_counter()

    @guarded("eval regions", vital=True)
    def close(self) -> None:
        """Detach: the last update counts, a region still open ends at its last forward."""
        self._settle_update()
        self._close_region(self._region_end)
        self._disarm()
        self._narrowed, self._tracked, self._in_eval, self._tops = False, {}, set(), {}

    # -- helpers -------------------------------------------------------------------
    def _close_region(self, end_perf: float) -> None:
        region, self._region = self._region, None
        if region is not None and end_perf > region[1]:
            self._emit(region, end_perf, self._region_forwards)

    def _emit(self, t0: _Stamp, end_perf: float, forwards: int) -> None:
        self.writer.emit({"k": "span", "c": SPAN, "t0": t0[0], "dt": end_perf - t0[1],
                          "name": "forward passes without backward"})
        for _ in range(forwards):  # the eval batches: what a fix of the loop's eval size names
            self.writer.count(FORWARDS, 0.0)

    def _settle_update(self) -> None:
        if self._pending_update is not None and not self._optimizer_seen:
            self.th.record_step_at(self._pending_update)
            if not self._narrowed:
                self._narrow()
        self._pending_update = None


def _trained(module: Any) -> bool:
    """Has the module a parameter that requires grad? (first one only: cheap per forward)."""
    for p in module.parameters():
        return bool(p.requires_grad)
    return False
