"""Hooks into data parallelism: what the collectives of DDP, FSDP and the script cost each step.

``DistributedDataParallel`` reduces gradients in its C++ reducer, or through a communication hook
the script registers. The doctor never registers one of its own: once any hook is in DDP's slot,
the reducer stops dividing by ``Join``'s effective world size (``join(divide_by_initial_world_size=
False)`` then behaves like ``True``), and the slot cannot be emptied again (issue #39, audit #34).
DDP's own all-reduce is timed from outside instead: at a synchronizing backward, a pre-hook on its
root node (removed when the backward returns) queues an autograd final callback; it runs once the
backward's own work is over, before DDP's finalize (queued when the last bucket was launched), and
queues a second one that runs after it, once DDP has waited for the all-reduce. Between the two is
the all-reduce not hidden behind backward; the buckets and bytes are DDP's own (its logging data).
What this loses against a hook: the seconds a bucket was in flight while backward still ran (the
hidden part), so a step's ``comm_s`` is the exposed part only. A hook the script registers itself
is wrapped in a timer (the arithmetic stays theirs), each bucket's launch and completion known. Direct
``torch.distributed`` calls (the script's own, FSDP's all-gather / reduce-scatter) are timed
around the call; a call with ``async_op=True`` is counted (calls, bytes) but not timed.

What is written is one ``comm`` event per optimizer step (the micro-steps since the last one,
those that synchronized, buckets, bytes, seconds) and one ``communication`` span per backward
whose all-reduce the host waited for after the backward's last bucket was launched: that is the
part not hidden behind backward. On CPU (gloo) DDP's backward waits for every bucket before it
returns, so that wait is exposed on the host clock. With NCCL on CUDA the host does not wait
(the wait is on the GPU stream): buckets and bytes are counted, ``exposed_s`` is null, and the
wait is measured on the GPU's own clock instead: a CUDA event on the training stream at each
bucket's launch (the last one kept) and one once backward is over, after DDP queued its wait for
the all-reduce (an autograd final callback queued behind DDP's own); the GPU clock
(:meth:`GpuMarks.comm_end`) resolves the pair with ``query()``, never a sync, into the step's
``comm_wait_s`` and a ``communication`` span.

FSDP's collectives are direct calls (torch 2.13's FSDP calls ``all_gather_single`` and
``reduce_scatter_single``); an all-gather inside backward is a parameter gathered again after the
forward resharded it, counted apart. On CUDA they return to the host at once; the training stream's
waits for them are marked instead, around FSDP2's ``wait_for_unshard`` and its end-of-backward
callback (the last reduce-scatters), and resolved by the GPU clock like DDP's.

A DDP model built before the hooks came in (``attach``, ``gpudoctor.profile()`` around a loop) is
adopted at its next training forward: its settings are read then, and its default all-reduce is
timed as above. A slot the script filled before (its own hook, a C++ built-in) stays untimed;
micro-steps are still counted. Nothing is left on the model after a detach. Stdlib-only; torch is read from ``sys.modules``.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpudoctor.core.events import COMMUNICATION, CommEvent, DdpEvent, SpanEvent
from gpudoctor.hooks import apply, patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

if TYPE_CHECKING:
    from gpudoctor.hooks.device_clock import GpuMarks

# The collectives of ``torch.distributed`` timed when the script (or FSDP) calls them directly.
DIRECT = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
          "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "barrier", "all_to_all",
          "all_to_all_single", "gather", "scatter")
# The all-gathers FSDP unshards its parameters with (``*_single`` from torch 2.13 on); one inside
# backward re-gathers what the forward gathered and then freed (``reshard_after_forward``).
GATHERS = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_single"})
# Where FSDP's gathers are called from, by version: FSDP2 (``fully_shard``), FSDP1 (the wrapper class).
_FSDP_CALLERS = (("torch.distributed.fsdp._fully_shard", 2), ("torch.distributed._composable.fsdp", 2),
                 ("torch.distributed.fsdp", 1))
ADJACENT_S = 1e-4  # direct calls closer than this join one span (a loop of small collectives)
SPANS_PER_STEP = 64  # direct-call spans a step writes at most; later calls join the last one
_HELD = "direct collective"  # the writer's hold key for the open direct-call span
_UNUSED_CHECK_STEPS = 1  # steps whose gradients are looked at for parameters DDP never saw used
_BUCKET_READS = 3  # backwards whose bucket sizes are read from DDP (its rebuild follows the first)




@dataclass
class _Tally:
    """One optimizer step's collectives so far."""

    micro: int = 0
    synced: int = 0
    buckets: int = 0
    bytes: int = 0
    comm_s: float = 0.0
    exposed_s: float | None = None  # None until a backward's wait is known on the host
    search_s: float = 0.0
    direct: int = 0
    direct_bytes: int = 0
    direct_s: float = 0.0
    gather_bwd: int = 0  # all-gathers inside backward (FSDP re-gathering resharded parameters)
    gather_bwd_bytes: int = 0
    gather_bwd_s: float = 0.0  # ... the host's seconds in the blocking ones


def wall_of(perf_t: float) -> float:
    """``time.perf_counter()`` reading ``perf_t`` on the clock the other events use, as it reads now.

    The offset between the two is read at each use, not once: when the wall clock is stepped (NTP,
    a VM resumed: one stepped 18 s under a DDP test here) the events written after the step and
    these spans stay on one timeline, where an offset read at start put every all-reduce 18 s before
    the steps around it and the report counted no communication at all."""
    return perf_t + (time.time() - time.perf_counter())


@dataclass
class _Round:
    """The gradient buckets of one backward: ``[launch, done, bytes, on_host]`` each (perf_counter)."""

    buckets: list[list[Any]] = field(default_factory=list)


class CommHooks:
    """State shared by the collective patches of one process."""

    current: CommHooks | None = None  # the installed one (set by install): a timed hook left on DDP by an earlier one reports here

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.tally = _Tally()
        self.round = _Round()
        self.steps = 0
        self._built: weakref.WeakSet[Any] = weakref.WeakSet()  # DDP models built while hooked
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()  # ... whose slot the script filled (timed or not)
        self._pending: weakref.ref[Any] | None = None  # a DDP model whose forward's backward will all-reduce
        self._buckets: weakref.WeakKeyDictionary[Any, tuple[int, bool, list[int]]] = weakref.WeakKeyDictionary()
        self._inside = threading.local()  # in our bucket hook: its all_reduce is DDP's, not direct
        self._held: SpanEvent | None = None  # a direct call's wait not written yet (held by the writer)
        self._held_end = 0.0  # its end, perf_counter
        self._spans = 0  # direct-call spans written this step
        self.gpu_marks: Any = lambda: None  # the GPU clock's marks once it runs (set by install), else None
        self.gpu_end_queued = False  # this backward's end-of-backward mark is queued with autograd
        self.closed = False  # uninstalled: a timed hook left on a DDP model (DDP keeps it) only passes through
        self.fsdp: int | None = None  # 1 or 2: the FSDP whose all-gathers were seen (its callers' module)

    # -- install ------------------------------------------------------------------------------
    def install_ddp(self, mod: ModuleType) -> None:
        cls = getattr(mod, "DistributedDataParallel", None)
        if cls is None:
            return
        patch.replace(cls, "__init__", self._wrap_init)
        patch.replace(cls, "register_comm_hook", self._wrap_register)
        if callable(getattr(cls, "_register_builtin_comm_hook", None)):
            patch.replace(cls, "_register_builtin_comm_hook", self._wrap_builtin)
        patch.replace(cls, "_pre_forward", self._wrap_pre_forward)
        patch.replace(cls, "_post_forward", self._wrap_post_forward)
        autograd = sys.modules.get("torch.autograd")
        if autograd is not None and callable(getattr(autograd, "_engine_run_backward", None)):
            patch.replace(autograd, "_engine_run_backward", self._wrap_engine)

    def install_fsdp_group(self, mod: ModuleType) -> None:
        """FSDP2 on CUDA: the training stream's wait for each unshard's all-gather, on the GPU clock."""
        cls = getattr(mod, "FSDPParamGroup", None)
        if cls is not None and callable(getattr(cls, "wait_for_unshard", None)):
            patch.replace(cls, "wait_for_unshard", self._wrap_fsdp_wait("gather", "device"))

    def install_fsdp_state(self, mod: ModuleType) -> None:
        """FSDP2 on CUDA: at the end of backward, the training stream's wait for the last reduce-scatters."""
        cls = getattr(mod, "FSDPState", None)
        if cls is not None and callable(getattr(cls, "_root_post_backward_final_callback", None)):
            patch.replace(cls, "_root_post_backward_final_callback", self._wrap_fsdp_wait("rs", "_device"))

    def _wrap_fsdp_wait(self, kind: str, device_attr: str) -> Any:
        hooks = self

        def wrap(fn: Any) -> Any:
            def waits(obj: Any, *args: Any, **kwargs: Any) -> Any:
                began = hooks._fsdp_wait_start(obj, device_attr, kind)
                try:
                    out = fn(obj, *args, **kwargs)
                except BaseException as exc:
                    patch.hide_wrapper(exc)
                    raise
                if began is not None:
                    hooks._fsdp_wait_end(began, kind)
                return out

            return waits

        return wrap

    @guarded("GPU clock: FSDP")
    def _fsdp_wait_start(self, obj: Any, device_attr: str, kind: str) -> tuple[GpuMarks, Any] | None:
        """``G0`` / ``R0`` when ``obj`` (a param group, the root state) is on CUDA and has a wait to
        queue (an unshard pending); else None."""
        device = getattr(obj, device_attr, None)
        if self.closed or getattr(device, "type", None) != "cuda":
            return None
        if kind == "gather" and not getattr(obj, "_all_gather_result", None):
            return None
        marks: GpuMarks | None = self.gpu_marks()
        return (marks, marks.fsdp_wait_start()) if marks is not None else None

    @guarded("GPU clock: FSDP")
    def _fsdp_wait_end(self, began: tuple[GpuMarks, Any], kind: str) -> None:
        marks, token = began
        marks.fsdp_wait_end(token, kind, kind == "gather" and _in_backward())

    def install_direct(self, dist: ModuleType) -> None:
        for name in DIRECT:
            if callable(getattr(dist, name, None)):
                patch.replace(dist, name, self._wrap_direct)

    def close(self) -> None:
        """Recording is over (a detach, the end of ``gpudoctor.profile()``): time nothing more."""
        self.closed = True
        self.round = _Round()
        self._emit_held()
        if CommHooks.current is self:
            CommHooks.current = None

    # -- DDP ------------------------------------------------------------------------------------
    def _wrap_init(self, fn: Any) -> Any:
        hooks = self

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            if apply.active():  # ``gpudoctor try``: the fix's DDP arguments
                args, kwargs = apply.call_kwargs("ddp", "DistributedDataParallel", fn, (ddp, *args), kwargs, first=1)
            try:
                fn(ddp, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            hooks._on_init(ddp)

        return __init__

    @guarded("DDP settings")
    def _on_init(self, ddp: Any) -> None:
        self._built.add(ddp)
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        group = getattr(ddp, "process_group", None)
        cap = getattr(ddp, "bucket_bytes_cap", None)
        event: DdpEvent = {
            "k": "ddp", "t": time.time(),
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "bucket_cap_mb": round(cap / 2**20, 3) if isinstance(cap, (int, float)) else None,
            "world_size": _group_size(group),
            "backend": _backend(group),
            "params": len(params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "device": str(params[0].device.type) if params else None,
        }
        self.writer.emit(event)

    def _wrap_register(self, fn: Any) -> Any:
        hooks = self

        def register_comm_hook(ddp: Any, state: object, hook: Any) -> None:
            timed = hooks._timed_or_none(hook)
            try:
                fn(ddp, state, hook if timed is None else timed)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            hooks._hooked.add(ddp)

        return register_comm_hook

    def _wrap_builtin(self, fn: Any) -> Any:
        hooks = self

        def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            try:
                fn(ddp, comm_hook_type)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            hooks._hooked.add(ddp)  # DDP's slot is taken (by C++, untimed)

        return _register_builtin_comm_hook

    @guarded("DDP communication timing")
    def _timed_or_none(self, hook: Any) -> Any:
        return self.timed(hook)

    def timed(self, hook: Any) -> Any:
        """``hook`` (a DDP communication hook) with each bucket's launch and completion timed."""
        hooks = self

        @functools.wraps(hook)
        def timed_hook(state: object, bucket: Any) -> Any:
            now = hooks if not hooks.closed else CommHooks.current  # detached; re-attached, maybe
            if now is None or now.closed:
                return hook(state, bucket)
            began = now._bucket_begin()
            try:
                fut = hook(state, bucket)
            finally:
                now._inside.on = False
            record = now._bucket_launched(began, bucket)
            if record is None:
                return fut
            return fut.then(functools.partial(_completed, now, record))

        return timed_hook

    def _bucket_begin(self) -> float:
        self._inside.on = True
        return time.perf_counter()

    @guarded("DDP communication timing")
    def _bucket_launched(self, began: float, bucket: Any) -> list[Any] | None:
        buf = bucket.buffer()
        on_host = buf.device.type == "cpu"
        record = [began, None, int(buf.numel() * buf.element_size()), on_host]
        self.round.buckets.append(record)
        if not on_host:
            self._gpu_bucket()
        return record

    @guarded("GPU clock: all-reduce")
    def _gpu_bucket(self) -> None:
        """A CUDA bucket: a mark on the training stream at its launch, and once per backward an
        autograd final callback that queues another: it runs after DDP's finalize (queued once the
        last bucket was ready, so after our first callback), when DDP has made the stream wait for
        the all-reduce. Two callbacks keep that order whenever DDP queues its own."""
        marks: GpuMarks | None = self.gpu_marks()
        if marks is None:
            return
        marks.comm_launch()
        if self.gpu_end_queued:
            return
        self.gpu_end_queued = True
        engine = sys.modules["torch"].autograd.Variable._execution_engine
        engine.queue_callback(functools.partial(engine.queue_callback, functools.partial(_backward_over, self, marks)))

    def _wrap_pre_forward(self, fn: Any) -> Any:
        hooks = self

        def _pre_forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
            hooks._before_forward(ddp)
            try:
                return fn(ddp, *inputs, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise

        return _pre_forward

    @guarded("DDP communication timing")
    def _before_forward(self, ddp: Any) -> None:
        torch = sys.modules["torch"]
        if not (ddp.training and torch.is_grad_enabled()):
            return
        self._close_round()  # the previous backward is over: its buckets are all known
        if apply.active():  # ``gpudoctor try``: no_sync() on all but the last micro-step
            sync = apply.ddp_sync(self.tally.micro)
            if sync is not None:
                ddp.require_backward_grad_sync = sync
        self.tally.micro += 1
        self.tally.synced += bool(getattr(ddp, "require_backward_grad_sync", True))
        if ddp not in self._built:
            self._adopt(ddp)
        self._pending = weakref.ref(ddp) if self._reducer_default(ddp) else None

    def _adopt(self, ddp: Any) -> None:
        """A DDP model built before the hooks: its settings now; a hook slot the script filled stays untimed."""
        self._on_init(ddp)
        logged = getattr(ddp, "_get_ddp_logging_data", None)
        if callable(logged) and logged().get("comm_hook"):
            self._hooked.add(ddp)

    def _reducer_default(self, ddp: Any) -> bool:
        """Will this forward's backward all-reduce through DDP's own C++ path (no hook in the slot)?"""
        return (bool(getattr(ddp, "require_backward_grad_sync", True)) and ddp not in self._hooked
                and not getattr(ddp, "_comm_hooks", None) and not getattr(ddp, "_use_python_reducer", False)
                and getattr(ddp, "mixed_precision", None) is None)

    # -- DDP's own all-reduce, timed from autograd's final callbacks (no hook in DDP's slot) --------
    def _wrap_engine(self, fn: Any) -> Any:
        hooks = self

        def _engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            # ``backward()`` only (it accumulates into .grad, where DDP's reducer hooks are); not ``autograd.grad``
            watch = hooks._pending is not None and kwargs.get("accumulate_grad", True)
            handle = hooks._watch_backward(t_outputs) if watch else None
            try:
                return fn(t_outputs, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            finally:
                if handle is not None:
                    handle.remove()

        return _engine_run_backward

    @guarded("DDP communication timing")
    def _watch_backward(self, t_outputs: Any) -> Any:
        """A pre-hook on the backward's root node (removed when it returns): it queues the callbacks."""
        ddp = self._pending() if self._pending is not None else None
        self._pending = None
        if ddp is None or self.closed:
            return None
        outputs = t_outputs if isinstance(t_outputs, (list, tuple)) else (t_outputs,)
        root = next((t.grad_fn for t in outputs if getattr(t, "grad_fn", None) is not None), None)
        if root is None:
            return None
        return root.register_prehook(functools.partial(_backward_began, self, weakref.ref(ddp)))

    @guarded("DDP communication timing")
    def _began(self, ddp_ref: weakref.ref[Any]) -> None:
        engine = sys.modules["torch"].autograd.Variable._execution_engine
        engine.queue_callback(functools.partial(_compute_over, self, ddp_ref))

    def _buckets_of(self, ddp: Any) -> tuple[bool, list[int]]:
        """Is the model on the host, and its buckets' bytes: read again until DDP's rebuild (after its
        first backward) has surely happened, then kept (a read walks the model and DDP's logging data)."""
        known = self._buckets.get(ddp)
        if known is not None and known[0] >= _BUCKET_READS:
            return known[1], known[2]
        on_host = known[1] if known is not None else _params_device(ddp) == "cpu"
        sizes = _bucket_sizes(ddp)
        self._buckets[ddp] = ((known[0] if known is not None else 0) + 1, on_host, sizes)
        return on_host, sizes

    @guarded("DDP communication timing")
    def _compute_over(self, ddp_ref: weakref.ref[Any]) -> None:
        """Backward's own work is over; DDP's finalize (and its wait for the all-reduce) comes next."""
        ddp = ddp_ref()
        if ddp is None:
            return
        now = time.perf_counter()
        on_host, sizes = self._buckets_of(ddp)
        record = [now, None, sum(sizes), on_host, len(sizes)]
        self.round.buckets.append(record)
        marks: GpuMarks | None = None if on_host else self.gpu_marks()
        if marks is not None:
            marks.comm_launch()
        engine = sys.modules["torch"].autograd.Variable._execution_engine
        engine.queue_callback(functools.partial(_all_reduced, self, record, marks))

    def _wrap_post_forward(self, fn: Any) -> Any:
        hooks = self
        perf = time.perf_counter

        def _post_forward(ddp: Any, output: Any) -> Any:
            p0 = perf()
            try:
                out = fn(ddp, output)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            if getattr(ddp, "find_unused_parameters", False) and not getattr(ddp, "static_graph", False):
                hooks._searched(ddp, perf() - p0)
            return out

        return _post_forward

    @guarded("DDP communication timing")
    def _searched(self, ddp: Any, seconds: float) -> None:
        torch = sys.modules["torch"]
        if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            self.tally.search_s += seconds

    def _close_round(self) -> None:
        """Add the last backward's buckets to the step: in-flight seconds, and the wait after its
        last bucket was launched (the backward's own work was over), when the host waited for it."""
        buckets, self.round = self.round.buckets, _Round()
        if not buckets:
            return
        t = self.tally
        t.buckets += sum(b[4] if len(b) > 4 else 1 for b in buckets)
        t.bytes += sum(b[2] for b in buckets)
        done = [b for b in buckets if b[1] is not None]
        t.comm_s += _union_s([(b[0], b[1]) for b in done])
        if len(done) < len(buckets) or not all(b[3] for b in buckets):
            return  # NCCL: the host never waited; or a bucket still in flight at a step
        last_launch = max(b[0] for b in buckets)
        exposed = max(0.0, max(b[1] for b in buckets) - last_launch)
        t.exposed_s = (t.exposed_s or 0.0) + exposed
        if exposed > 0:
            self.writer.emit({"k": "span", "c": COMMUNICATION, "t0": wall_of(last_launch),
                              "dt": exposed, "name": "DDP gradient all-reduce"})

    # -- direct torch.distributed calls -------------------------------------------------------
    def _wrap_direct(self, fn: Any) -> Any:
        hooks = self
        name = getattr(fn, "__name__", "collective")
        perf = time.perf_counter

        def collective(*args: Any, **kwargs: Any) -> Any:
            if getattr(hooks._inside, "on", False) or patch.depth("collective"):
                try:
                    return fn(*args, **kwargs)  # DDP's own all-reduce in our hook; a collective in one
                except BaseException as exc:
                    patch.hide_wrapper(exc)
                    raise
            patch._enter("collective")
            p0 = perf()
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            finally:
                patch._leave("collective")
                hooks._direct(name, args, kwargs, p0, perf() - p0)

        return collective

    @guarded("collective timing")
    def _direct(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], p0: float, seconds: float) -> None:
        t = self.tally
        tensors = _tensors(args, kwargs)
        size = max((x.numel() * x.element_size() for x in tensors), default=0)  # an all_gather's list: one
        t.direct += 1
        t.direct_bytes += size
        blocking = not kwargs.get("async_op")  # an async call returns at once: its time is spent where it is waited on
        on_host = blocking and all(x.device.type == "cpu" for x in tensors)  # the host waited (gloo; a barrier)
        if name in GATHERS:
            self._gather(_gathered_bytes(args, kwargs, size), seconds if on_host else 0.0)
        if not blocking:
            return
        t.direct_s += seconds
        if seconds > 0 and on_host:
            self._direct_wait(name, p0, seconds)

    def _gather(self, size: int, host_s: float) -> None:
        """An all-gather: FSDP's (which one, from its caller's module, once) and, inside backward, a
        re-gather of parameters the forward freed after use."""
        if not self.fsdp:
            self.fsdp = _fsdp_caller(sys._getframe(1)) or None
        if not _in_backward():
            return
        t = self.tally
        t.gather_bwd += 1
        t.gather_bwd_bytes += size
        t.gather_bwd_s += host_s

    def _direct_wait(self, name: str, p0: float, seconds: float) -> None:
        """A blocking call's wait, as a span: calls back to back (less than :data:`ADJACENT_S` apart,
        or past :data:`SPANS_PER_STEP` in a step) join one span of their summed seconds, so a loop of
        many small collectives writes a few lines, not one per call. The open span is held by the
        writer (written at exit if no step comes)."""
        if self._held is not None and (p0 - self._held_end < ADJACENT_S or self._spans >= SPANS_PER_STEP):
            self._held_end = p0 + seconds
            self._held["dt"] += seconds
            return
        self._emit_held()
        self._held = {"k": "span", "c": COMMUNICATION, "t0": wall_of(p0), "dt": seconds,
                      "name": f"torch.distributed.{name}"}
        self._held_end = p0 + seconds
        self.writer.hold(_HELD, self._held)

    def _emit_held(self) -> None:
        if self._held is not None:
            self._held = None
            self._spans += 1
            self.writer.release(_HELD)

    # -- steps --------------------------------------------------------------------------------
    @guarded("DDP communication timing")
    def step_end(self, n: int, t: float) -> None:
        """An optimizer step ended: its collectives as one ``comm`` event (none when it had none)."""
        self._close_round()
        self._emit_held()
        self._spans = 0
        self.steps += 1
        tally, self.tally = self.tally, _Tally()
        if not (tally.micro or tally.direct):
            return
        event: CommEvent = {"k": "comm", "t": t, "n": n, "micro": tally.micro, "synced": tally.synced,
                            "buckets": tally.buckets, "bytes": tally.bytes, "comm_s": round(tally.comm_s, 6),
                            "exposed_s": None if tally.exposed_s is None else round(tally.exposed_s, 6),
                            "search_s": round(tally.search_s, 6), "direct": tally.direct,
                            "direct_bytes": tally.direct_bytes, "direct_s": round(tally.direct_s, 6)}
        if self.steps <= _UNUSED_CHECK_STEPS and self._built:
            event["unused_params"] = sum(_without_grad(m) for m in list(self._built))
        if self.fsdp:
            event["fsdp"] = self.fsdp
            event["gather_bwd"] = tally.gather_bwd
            event["gather_bwd_bytes"] = tally.gather_bwd_bytes
            event["gather_bwd_s"] = round(tally.gather_bwd_s, 6)
        self.writer.emit(event)


def _backward_began(hooks: CommHooks, ddp_ref: weakref.ref[Any], grad_outputs: Any) -> None:
    """The root node's pre-hook: returns None, so the gradients flow on untouched."""
    hooks._began(ddp_ref)


def _compute_over(hooks: CommHooks, ddp_ref: weakref.ref[Any]) -> None:
    hooks._compute_over(ddp_ref)


@guarded("DDP communication timing")
def _all_reduced(hooks: CommHooks, record: list[Any], marks: GpuMarks | None) -> None:
    """After DDP's finalize: the host waited for the all-reduce (gloo) or the stream was made to (NCCL)."""
    record[1] = time.perf_counter()
    if marks is not None:
        marks.comm_end()


def _params_device(ddp: Any) -> str | None:
    for p in ddp.module.parameters():
        return str(p.device.type)
    return None


def _bucket_sizes(ddp: Any) -> list[int]:
    """DDP's gradient buckets' bytes, from its own logging data (``"bucket_sizes": "1024, 80"``)."""
    logged = getattr(ddp, "_get_ddp_logging_data", None)
    text = logged().get("bucket_sizes", "") if callable(logged) else ""
    return [int(x) for x in re.findall(r"\d+", str(text))]


@guarded("GPU clock: all-reduce")
def _backward_over(hooks: CommHooks, marks: GpuMarks) -> None:
    hooks.gpu_end_queued = False
    marks.comm_end()


def _completed(hooks: CommHooks, record: list[Any], fut: Any) -> Any:
    """The bucket's future completed (on the backend's thread): note when, hand its value on."""
    record[1] = time.perf_counter()
    return fut.value()


def _gathered_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], largest: int) -> int:
    """What an all-gather gathers: its output list's bytes (``all_gather(list, tensor)``, FSDP1 on
    gloo), else its largest tensor (the output of ``all_gather_single`` / ``_into_tensor``)."""
    out = args[0] if args else kwargs.get("tensor_list")
    if isinstance(out, (list, tuple)):
        return sum(int(x.numel() * x.element_size()) for x in out if hasattr(x, "numel"))
    return largest


def _in_backward() -> bool:
    """Inside autograd's backward (a graph task is running on this thread)."""
    graph_task = getattr(sys.modules["torch"]._C, "_current_graph_task_id", None)
    return graph_task is not None and graph_task() != -1


def _fsdp_caller(frame: Any) -> int:
    """1 or 2 when FSDP (the wrapper class, or ``fully_shard``) made the call: one of the few frames
    above ``frame`` is in its modules (a wrapper of the script's may sit between); 0 otherwise."""
    for _ in range(8):
        if frame is None:
            break
        module = str(frame.f_globals.get("__name__", ""))
        for prefix, version in _FSDP_CALLERS:
            if module.startswith(prefix):
                return version
        frame = frame.f_back
    return 0


def _union_s(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _without_grad(ddp: Any) -> int:
    """Parameters that require a gradient but have none after the first step's backward."""
    return sum(1 for p in ddp.module.parameters() if p.requires_grad and p.grad is None)


def _group_size(group: Any) -> int | None:
    try:
        return int(group.size()) if group is not None else None
    except Exception:
        return None


def _backend(group: Any) -> str | None:
    dist = sys.modules.get("torch.distributed")
    try:
        return str(dist.get_backend(group)) if dist is not None and group is not None else None
    except Exception:
        return None


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    torch = sys.modules["torch"]
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value[:64] if isinstance(v, torch.Tensor))
    return found
