"""The GPU's own clock: CUDA events at step ends, around loader waits, syncs and H2D copies.

CUDA runs asynchronously: ``loss.backward()`` returns once its kernels are queued, so the
host's clock says when work was *asked for*, not when the GPU did it. This module records
timing events on the training stream and reads them back with ``query()`` once the GPU has
passed them: it never synchronises. What the events give, exactly:

* a loader wait between ``W0`` and ``W1``: nothing is queued on the stream while the host
  waits for a batch, so the GPU reaches ``W1`` at ``max(end of its queue, host time of W1)``
  and ``elapsed(W0, W1)`` is the part of the wait the GPU really sat idle (0 in the
  "trap": the GPU was still running the previous step);
* a step: ``elapsed(R[n-1], R[n])`` is the step's time on the GPU, ``R`` its reference: the end
  ``W1`` of its first loader wait (recorded anyway), or an event at the step end when it had no
  wait; so a step with one wait costs two records;
* a checkpoint save between ``S0`` and ``S1``: ``elapsed(S0, S1)`` is the GPU's part of the save
  (its copies to the host and the idle while it serialises and writes); the part of the host's
  save before the GPU reached ``S0`` it spent finishing the previous step;
* an H2D copy between ``A`` and ``B``: ``elapsed(A, B)`` is the copy on the GPU;
* DDP's gradient all-reduce under NCCL between ``C0`` and ``C1``: ``C0`` at each bucket's launch
  (the last one kept), ``C1`` once backward is over and DDP has queued its wait for the
  all-reduce on the training stream; ``elapsed(C0, C1)`` is the time the stream sat waiting for
  the network after backward's last bucket (its copy-back kernels included): the exposed
  all-reduce on the GPU's clock;
* FSDP2's all-gathers under NCCL between ``G0`` and ``G1``: around the wait for an unshard (its
  ``wait_for_unshard``: the training stream waits for the all-gather stream's event, then copies
  the gathered parameters out); ``elapsed(G0, G1)`` is the all-gather not hidden behind the work
  before it (copy-out included), kept apart inside backward (a re-gather); and ``R0``/``R1`` around
  FSDP's end-of-backward callback, where the stream waits for the last reduce-scatters;
* a host sync (``.item()``, ``.cpu()``, ``cuda.synchronize``): the GPU's queue is empty when it
  returns, so it idles until the host queues more. The events bound that idle by the host's
  own time from the sync's return to the next mark (``sync_idle_s``, an upper bound).

The narrow boundary is :class:`DeviceClock` (``record``, ``query``, ``elapsed_ms``): the real
one wraps ``torch.cuda.Event``; tests replay scenarios through a fake GPU queue
(``tests/fake_cuda.py``), as NVML is faked at its binding.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

MAX_PENDING = 20_000  # marks not yet passed by the GPU; beyond this new ones are dropped and counted


class DeviceClock(Protocol):
    """Timing events on the training stream; nothing here may block the host."""

    def record(self) -> Any:
        """A timing event queued on the current stream now; returns its handle, or None when no
        event may be recorded now (a CUDA graph is being captured)."""

    def query(self, handle: Any) -> bool:
        """Has the GPU passed ``handle``? Never waits."""

    def elapsed_ms(self, a: Any, b: Any) -> float:
        """GPU milliseconds from ``a`` to ``b``; both must have been passed (``query`` true)."""

    def capturing(self) -> bool:
        """Is the current stream capturing a CUDA graph? Then nothing may be recorded or queried:
        ``cudaEventQuery`` mid-capture invalidates the training's capture (issue #34, row 6)."""


class CudaClock:
    """``torch.cuda.Event(enable_timing=True)`` on the current stream (the one training uses)."""

    def __init__(self, torch: ModuleType) -> None:
        self._event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing

    def capturing(self) -> bool:
        return bool(self._capturing())

    def record(self) -> Any:
        if self._capturing():  # a timing event would invalidate the training's CUDA graph capture
            return None
        event = self._event(enable_timing=True)
        event.record()  # the current stream: where the training's own kernels go
        return event

    def query(self, handle: Any) -> bool:
        return bool(handle.query())

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b))


class _Mark:
    """One mark; plain slots (no dataclasses: this module loads into the training at startup)."""

    __slots__ = ("kind", "host_t", "handles", "host_dt", "n")

    def __init__(self, kind: str, host_t: float, handles: tuple[Any, ...], host_dt: float = 0.0,
                 n: int = 0) -> None:
        self.kind = kind  # wait | save | sync | h2d | comm | gather | rs | step | stepref | reset
        self.host_t = host_t  # epoch seconds when the host recorded the (last) handle
        self.handles = handles
        self.host_dt = host_dt  # host seconds: the wait, the sync's block, the copy's block
        self.n = n


class _StepSums:
    __slots__ = ("waits", "wait_idle_s", "syncs", "sync_block_s", "sync_idle_s", "h2d", "h2d_s", "h2d_block_s",
                 "saves", "save_s", "comms", "comm_wait_s", "gathers", "gather_wait_s", "gathers_bwd",
                 "gather_bwd_wait_s", "rs_wait_s")

    def __init__(self) -> None:
        self.waits = self.syncs = self.h2d = self.saves = self.comms = self.gathers = self.gathers_bwd = 0
        self.wait_idle_s = self.sync_block_s = self.sync_idle_s = self.h2d_s = self.h2d_block_s = 0.0
        self.save_s = self.comm_wait_s = self.gather_wait_s = self.gather_bwd_wait_s = self.rs_wait_s = 0.0


class GpuMarks:
    """Marks recorded by the hooks, resolved into ``gpu_wait`` / ``gpu_step`` events in order.

    ``poll()`` reads back only marks the GPU has passed (``query``), oldest first, and stops at
    the first one still queued: called at each step end and at exit, it costs a few queries.
    """

    def __init__(self, clock: DeviceClock, emit: Callable[[Any], None],
                 now: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.emit = emit
        self.now = now
        self.pending: deque[_Mark] = deque()
        self.dropped = 0
        self._w0: tuple[float, Any] | None = None
        self._s0: tuple[float, Any] | None = None  # an open checkpoint save
        self._c0: tuple[float, Any] | None = None  # the last gradient bucket launched in this backward
        self._step_ref: Any = None  # this step's reference event: its first wait's end
        self._prev_step: Any = None
        self._sums = _StepSums()
        self._open_sync: _Mark | None = None  # a sync whose idle waits for the next mark's handle

    # -- hot path: one record() and one append each ---------------------------------
    def wait_start(self, t0: float | None = None) -> None:
        """``t0``: the host wait span's own start, so the report pairs the two exactly."""
        handle = self.clock.record()
        self._w0 = (self.now() if t0 is None else t0, handle) if handle is not None else None

    def wait_end(self) -> None:
        if self._w0 is None:
            return
        t0, h0 = self._w0
        self._w0 = None
        t1 = self.now()
        h1 = self.clock.record()
        if h1 is not None and self._step_ref is None:
            self._step_ref = h1  # the step's first batch in hand: its reference on the GPU (no extra record)
        self._push(_Mark("wait", t0, (h0, h1), host_dt=t1 - t0))

    def save_start(self, t0: float) -> None:
        """A checkpoint save begins (host epoch ``t0``, the save span's start); the outermost one only."""
        if self._s0 is None:
            handle = self.clock.record()
            self._s0 = (t0, handle) if handle is not None else None

    def save_end(self) -> None:
        """The save returned. ``elapsed(S0, S1)``: the GPU's time from draining its queue (the
        previous step's work) to the save's end: the save's copies and the idle while it wrote."""
        if self._s0 is None:
            return
        t0, h0 = self._s0
        self._s0 = None
        self._push(_Mark("save", t0, (h0, self.clock.record()), host_dt=self.now() - t0))

    def sync(self, blocked_s: float) -> None:
        """A host sync just returned after blocking ``blocked_s`` seconds."""
        self._push(_Mark("sync", self.now(), (self.clock.record(),), host_dt=blocked_s))

    def h2d(self, before: Any, blocked_s: float) -> None:
        """A host-to-device copy recorded between ``before`` (from :meth:`mark`) and now."""
        if before is not None:
            self._push(_Mark("h2d", self.now(), (before, self.clock.record()), host_dt=blocked_s))

    def mark(self) -> Any:
        return self.clock.record()

    def comm_launch(self) -> None:
        """DDP launched a gradient bucket's all-reduce (its comm hook, on the training stream): one
        record; the backward's last one is kept as its ``C0``."""
        handle = self.clock.record()
        if handle is not None:
            self._c0 = (self.now(), handle)

    def comm_end(self) -> None:
        """Backward is over and DDP queued its wait for the all-reduce on the training stream (an
        autograd final callback after DDP's own): ``C1``. ``elapsed(C0, C1)`` is that wait."""
        if self._c0 is None:
            return
        t0, h0 = self._c0
        self._c0 = None
        self._push(_Mark("comm", t0, (h0, self.clock.record()), host_dt=self.now() - t0))

    def fsdp_wait_start(self) -> tuple[float, Any] | None:
        """FSDP is about to make the training stream wait for its collective stream: ``G0`` / ``R0``,
        handed back to :meth:`fsdp_wait_end` (the two may nest: the end-of-backward callback's)."""
        handle = self.clock.record()
        return (self.now(), handle) if handle is not None else None

    def fsdp_wait_end(self, began: tuple[float, Any] | None, kind: str, in_backward: bool = False) -> None:
        """The wait is queued (and the gathered parameters copied out): ``G1`` / ``R1``. ``kind``:
        ``gather`` (an unshard; ``in_backward``: a re-gather) or ``rs`` (the last reduce-scatters)."""
        if began is None:
            return
        t0, h0 = began
        self._push(_Mark(kind, t0, (h0, self.clock.record()), host_dt=self.now() - t0, n=int(in_backward)))

    def step_end(self, n: int) -> None:
        """The step's reference on the GPU is the end of its first loader wait (``W1``, already
        recorded): consecutive references are one loop period apart on the GPU, so a step costs
        no record of its own. A step with no loader wait (synthetic data) records one here."""
        handle, self._step_ref = self._step_ref, None
        kind = "stepref"  # an event recorded earlier: not a new mark for an open sync's idle
        if handle is None:
            handle, kind = self.clock.record(), "step"
        if handle is None:  # not timed (a graph capture): the next step's GPU time starts afresh
            self._push(_Mark("reset", self.now(), ()))
        else:
            self._push(_Mark(kind, self.now(), (handle,), n=n))
        self.poll()

    def _push(self, mark: _Mark) -> None:
        if any(h is None for h in mark.handles):
            return  # an event that could not be recorded (a graph capture): the mark is left out
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self.pending.append(mark)

    # -- read back -----------------------------------------------------------------------
    def poll(self) -> None:
        """Read back what the GPU has passed; nothing at all while a graph is being captured (a
        query then would invalidate the capture: the marks wait for the next poll outside it)."""
        if self.clock.capturing():
            return
        query = self.clock.query
        while self.pending:
            mark = self.pending[0]
            if mark.handles and not query(mark.handles[-1]):
                return
            self.pending.popleft()
            self._resolve(mark)

    def _resolve(self, mark: _Mark) -> None:
        if mark.kind == "reset":
            self._prev_step = None
            self._sums = _StepSums()
            return
        ms = self.clock.elapsed_ms
        if self._open_sync is not None and mark.kind != "stepref":  # idle after a sync: at most the host's time to this mark
            sync, self._open_sync = self._open_sync, None
            first = mark.handles[0]
            gpu_s = ms(sync.handles[0], first) / 1000.0 if self.clock.query(first) else 0.0
            self._sums.sync_idle_s += max(0.0, min(gpu_s, self._host_t0(mark) - sync.host_t))
        sums = self._sums
        if mark.kind == "wait":
            idle_s = max(0.0, ms(*mark.handles) / 1000.0)
            sums.waits += 1
            sums.wait_idle_s += idle_s
            self.emit({"k": "gpu_wait", "t0": mark.host_t, "dt": mark.host_dt, "idle_s": idle_s})
        elif mark.kind == "save":
            gpu_s = max(0.0, min(ms(*mark.handles) / 1000.0, mark.host_dt))
            sums.saves += 1
            sums.save_s += gpu_s
            self.emit({"k": "gpu_save", "t0": mark.host_t, "dt": mark.host_dt, "idle_s": gpu_s})
        elif mark.kind == "sync":
            sums.syncs += 1
            sums.sync_block_s += mark.host_dt
            self._open_sync = mark
        elif mark.kind == "comm":
            gpu_s = max(0.0, ms(*mark.handles) / 1000.0)
            sums.comms += 1
            sums.comm_wait_s += gpu_s
            if gpu_s > 0:  # the breakdown's communication: from the last launch on the host, the GPU's seconds
                self.emit({"k": "span", "c": "communication", "t0": mark.host_t, "dt": gpu_s,
                           "name": "DDP gradient all-reduce (GPU clock)"})
        elif mark.kind in ("gather", "rs"):
            self._resolve_fsdp(mark, sums)
        elif mark.kind == "h2d":
            sums.h2d += 1
            sums.h2d_s += max(0.0, ms(*mark.handles) / 1000.0)
            sums.h2d_block_s += mark.host_dt
        else:
            self._emit_step(mark)

    def _resolve_fsdp(self, mark: _Mark, sums: _StepSums) -> None:
        gpu_s = max(0.0, self.clock.elapsed_ms(*mark.handles) / 1000.0)
        if mark.kind == "rs":
            sums.rs_wait_s += gpu_s
            name = "FSDP reduce-scatter (GPU clock)"
        else:
            sums.gathers += 1
            sums.gather_wait_s += gpu_s
            if mark.n:
                sums.gathers_bwd += 1
                sums.gather_bwd_wait_s += gpu_s
            name = "FSDP all-gather (GPU clock)"
        if gpu_s > 0:
            self.emit({"k": "span", "c": "communication", "t0": mark.host_t, "dt": gpu_s, "name": name})

    def _host_t0(self, mark: _Mark) -> float:
        if mark.kind in ("wait", "save", "comm", "gather", "rs"):
            return mark.host_t  # their host_t is the start already
        return mark.host_t - mark.host_dt if mark.kind == "h2d" else mark.host_t

    def _emit_step(self, mark: _Mark) -> None:
        s = self._sums
        event: dict[str, Any] = {
            "k": "gpu_step", "t": mark.host_t, "n": mark.n,
            "gpu_s": (max(0.0, self.clock.elapsed_ms(self._prev_step, mark.handles[0]) / 1000.0)
                      if self._prev_step is not None else None),
            "waits": s.waits, "wait_idle_s": s.wait_idle_s,
            "syncs": s.syncs, "sync_block_s": s.sync_block_s, "sync_idle_s": s.sync_idle_s,
            "h2d": s.h2d, "h2d_s": s.h2d_s, "h2d_block_s": s.h2d_block_s,
        }
        if s.saves:
            event.update(saves=s.saves, save_s=s.save_s)
        if s.comms:
            event.update(comms=s.comms, comm_wait_s=s.comm_wait_s)
        if s.gathers or s.rs_wait_s:
            event.update(gathers=s.gathers, gather_wait_s=s.gather_wait_s, gathers_bwd=s.gathers_bwd,
                         gather_bwd_wait_s=s.gather_bwd_wait_s, rs_wait_s=s.rs_wait_s)
        if self.dropped:
            event["dropped"] = self.dropped
        self._prev_step = mark.handles[0]
        self._sums = _StepSums()
        self.emit(event)
