"""A fake CUDA device at the :class:`~gpudoctor.hooks.device_clock.DeviceClock` boundary.

No GPU here, so the GPU's clock is faked where NVML's binding is: a :class:`FakeGpu` is one
CUDA stream, a queue on a virtual clock. The host's time advances as the scenario says
(``host``), a launch queues a kernel that starts when the queue reaches it (``launch``), a sync
blocks the host until the queue is empty (``sync``), and a pageable ``.to("cuda")`` is a copy
then a sync. :class:`FakeClock` answers ``record``/``query``/``elapsed_ms`` from that queue, as
``torch.cuda.Event`` would, and the production :class:`GpuMarks` resolves them into the lines
the hooks write. The busy intervals are the ground truth the tests hold the doctor to.

:func:`replay` plays one of the three patterns of issue #25 into a recording folder:
``trap`` (the GPU is busy while the host "waits for data"), ``sync`` (a ``.item()`` mid-step
leaves the GPU idle), ``stall`` (a real data stall); and ``save`` (checkpoints of CUDA tensors:
the GPU finishes its step during the first part of each save).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.hooks.device_clock import GpuMarks
from tests.recording_builder import T0, RecordingBuilder


@dataclass
class FakeEvent:
    reached: float  # virtual epoch seconds at which the GPU passes this event


@dataclass
class FakeGpu:
    """One CUDA stream on a virtual clock shared with the host."""

    now: float = T0
    busy_until: float = T0
    busy: list[tuple[float, float]] = field(default_factory=list)
    queue_s: float | None = None  # GPU seconds the launch queue holds; a launch beyond blocks the host

    def host(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, gpu_s: float, launch_s: float = 0.002) -> None:
        if self.queue_s is not None:
            self.now = max(self.now, self.busy_until - self.queue_s)
        start = max(self.now, self.busy_until)
        self.busy_until = start + gpu_s
        self.busy.append((start, self.busy_until))
        self.now += launch_s

    def sync(self) -> float:
        """Block the host until the queue is empty; returns the seconds it blocked."""
        before = self.now
        self.now = max(self.now, self.busy_until)
        return self.now - before

    def busy_s(self, lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in self.busy)


class FakeClock:
    """``torch.cuda.Event`` on :class:`FakeGpu`: an event is passed when the queue reaches it."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.records = 0
        self.queries = 0
        self.capture = False  # a CUDA graph is being captured on the stream
        self.queries_in_capture = 0  # each would have invalidated the training's capture on a GPU

    def capturing(self) -> bool:
        return self.capture

    def record(self) -> FakeEvent | None:
        if self.capture:  # as CudaClock: no event while capturing
            return None
        self.records += 1
        return FakeEvent(max(self.gpu.now, self.gpu.busy_until))

    def query(self, handle: FakeEvent) -> bool:
        self.queries += 1
        if self.capture:
            self.queries_in_capture += 1
        return handle.reached <= self.gpu.now

    def elapsed_ms(self, a: FakeEvent, b: FakeEvent) -> float:
        return 1000.0 * (b.reached - a.reached)


MIB = 2.0**20


@dataclass
class FakeAllocator:
    """The CUDA caching allocator's counters at the :class:`~gpudoctor.hooks.cuda_memory.DeviceMemory`
    boundary: the scenario allocates and frees (MiB), the cache keeps what was freed (reserved never
    shrinks but by ``empty_cache``), and ``fragment`` caches a block of a size never asked again."""

    total_mib: float = 81559.0
    allocated_mib: float = 0.0
    reserved_mib: float = 0.0
    peak_mib: float = 0.0
    reads: int = 0

    def alloc(self, mib: float) -> None:
        self.allocated_mib += mib
        self.peak_mib = max(self.peak_mib, self.allocated_mib)
        self.reserved_mib = max(self.reserved_mib, self.allocated_mib)

    def free(self, mib: float) -> None:
        self.allocated_mib -= mib

    def fragment(self, mib: float) -> None:
        self.reserved_mib += mib

    def empty_cache(self) -> None:
        self.reserved_mib = self.allocated_mib

    def read(self) -> tuple[float, float, float]:
        self.reads += 1
        return self.allocated_mib * MIB, self.reserved_mib * MIB, self.peak_mib * MIB

    def total(self) -> float | None:
        return self.total_mib * MIB


@dataclass(frozen=True)
class Pattern:
    build_s: float  # batch build on the main process (0: workers have it ready)
    forward_s: float
    backward_s: float
    optimizer_s: float
    copy_s: float
    pageable: bool  # ``.to("cuda")`` from pageable memory blocks the host until the copy is done
    num_workers: int = 0
    sync_python_s: float | None = None  # ``.item()`` after forward, then this much host work
    save_every: int = 0  # ``torch.save(model.state_dict())`` after every this many steps (0: never)
    save_copy_s: float = 0.0  # the save's copies of the CUDA tensors to the host (GPU time)
    save_write_s: float = 0.0  # then the host serialises and writes; the GPU has nothing queued
    queue_s: float | None = None  # how far ahead the host may queue (CUDA's launch queue is bounded)

    @property
    def gpu_step_s(self) -> float:
        return self.copy_s + self.forward_s + self.backward_s + self.optimizer_s


PATTERNS = {
    # 100 ms GPU step, 60 ms batch build on the main process, pageable copy: the trap.
    "trap": Pattern(build_s=0.060, forward_s=0.030, backward_s=0.060, optimizer_s=0.008, copy_s=0.002,
                    pageable=True),
    # Workers keep batches ready; a loss.item() after forward, then 30 ms of Python (metrics).
    "sync": Pattern(build_s=0.0005, forward_s=0.040, backward_s=0.050, optimizer_s=0.010, copy_s=0.001,
                    pageable=False, num_workers=4, sync_python_s=0.030),
    # A 30 ms GPU step behind a 60 ms batch build: the GPU idles half the loop.
    "stall": Pattern(build_s=0.060, forward_s=0.010, backward_s=0.015, optimizer_s=0.004, copy_s=0.001,
                     pageable=True),
    # Workers keep batches ready; a 101 ms GPU step, the host at most one step ahead; every 10 steps
    # a save of the CUDA weights: it waits for the queued work (up to a step), copies them (50 ms on
    # the GPU), then writes (250 ms) while the GPU has nothing to do.
    "save": Pattern(build_s=0.0005, forward_s=0.030, backward_s=0.060, optimizer_s=0.010, copy_s=0.001,
                    pageable=False, num_workers=4, save_every=10, save_copy_s=0.050, save_write_s=0.250,
                    queue_s=0.101),
}

MODEL = {"k": "model", "class": "GPT2LMHeadModel", "params": 124_000_000,
         "config": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12}}
BATCH_ROWS, SEQ_LEN = 8, 512


@dataclass
class Replayed:
    root: Path
    gpu: FakeGpu
    clock: FakeClock
    loop_s: float  # first step's start to the last step's end, virtual seconds
    steps: int

    @property
    def true_busy(self) -> float:
        return self.gpu.busy_s(T0 + 1.0, T0 + 1.0 + self.loop_s) / self.loop_s


@dataclass
class FakeProcess:
    """One training process on the fake GPU: its stream, the events' clock, its recording and the
    production :class:`GpuMarks` writing into it."""

    gpu: FakeGpu
    clock: FakeClock
    builder: RecordingBuilder
    rows: list[dict[str, Any]]
    marks: GpuMarks
    start: float

    @classmethod
    def open(cls, root: Path, queue_s: float | None = None, clock: type[FakeClock] = FakeClock) -> FakeProcess:
        """A CUDA training's process with its process line alone: its GPU, a clock of ``clock``'s
        class on it, its recording and the marks writing into it."""
        gpu = FakeGpu(now=T0 + 1.0, busy_until=T0 + 1.0, queue_s=queue_s)
        gpu_clock = clock(gpu)
        b = RecordingBuilder(root, cores=8)
        rows = b.process(libs={"torch": "2.13.0"})
        return cls(gpu, gpu_clock, b, rows, GpuMarks(gpu_clock, rows.append, now=lambda: gpu.now), gpu.now)

    @classmethod
    def begin(cls, root: Path, num_workers: int, batch_size: int, queue_s: float | None = None) -> FakeProcess:
        """A CUDA training's process and its first lines: its loader, its first step, its torch
        configuration (bf16 autocast), :data:`MODEL`, and the GPU clock started."""
        proc = cls.open(root, queue_s)
        start = proc.start
        proc.rows += [
            {"k": "loader", "t": start, "id": 1, "num_workers": num_workers, "batch_size": batch_size,
             "pin_memory": False, "prefetch_factor": None, "persistent_workers": False,
             "params": ["dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers"]},
            {"k": "first_step", "t": start},
            {"k": "torch_cfg", "t": start, "cuda": True, "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
             "device_capability": [9, 0], "matmul_precision": "highest", "allow_tf32": False,
             "cudnn_allow_tf32": True, "param_dtype": "torch.float32", "autocast": True,
             "autocast_dtype": "torch.bfloat16", "libs": {}},
            {**MODEL, "t": start},
            {"k": "gpu_clock", "t": start, "device": "cuda:0", "source": "cuda_events"},
        ]
        return proc

    def fetch(self, build_s: float) -> None:
        """One DataLoader wait of ``build_s`` on the host, its span and its marks."""
        t0 = self.gpu.now
        self.marks.wait_start(t0)
        self.gpu.host(build_s)
        self.rows.append({"k": "span", "c": "data_wait", "t0": t0, "dt": self.gpu.now - t0,
                          "name": "DataLoader.__next__"})
        self.marks.wait_end()

    def copy(self, copy_s: float, pageable: bool) -> None:
        """The batch's ``.to("cuda")``: from pageable memory it waits for the queue (a sync)."""
        before = self.marks.mark()
        h0 = self.gpu.now
        self.gpu.launch(copy_s, launch_s=0.0002)
        if pageable:
            self.gpu.sync()
        self.marks.h2d(before, self.gpu.now - h0)

    def exit(self, batches: int, build_s: float) -> float:
        """The process exits (its queue drains, the marks are read back, the fetch counter flushed);
        returns the loop's virtual seconds."""
        self.gpu.sync()
        self.marks.poll()
        self.rows.append({"k": "counter", "t": self.gpu.now, "name": "fetch", "calls": batches,
                          "s": build_s * batches})
        self.builder.duration_s = self.gpu.now - T0 + 0.5
        return self.gpu.now - self.start


def play(p: Pattern, proc: FakeProcess, steps: int) -> None:
    """The loop ``for batch in loader: batch.to('cuda'); loss = model(batch); loss.backward(); opt.step()``."""
    gpu, marks, rows = proc.gpu, proc.marks, proc.rows
    for n in range(1, steps + 1):
        proc.fetch(p.build_s)
        rows.append({"k": "batch", "t": gpu.now, "tokens": BATCH_ROWS * SEQ_LEN, "pad": 0, "seq_len": SEQ_LEN})
        proc.copy(p.copy_s, p.pageable)
        gpu.launch(p.forward_s)
        if p.sync_python_s is not None:
            marks.sync(gpu.sync())
            gpu.host(p.sync_python_s)
        gpu.launch(p.backward_s)
        gpu.launch(p.optimizer_s)
        rows.append({"k": "step", "t": gpu.now, "n": n, "dt": 0.002})
        marks.step_end(n)
        if p.save_every and n % p.save_every == 0:
            save(p, marks, gpu, rows)


def save(p: Pattern, marks: GpuMarks, gpu: FakeGpu, rows: list[dict[str, Any]]) -> None:
    """``torch.save`` of CUDA tensors: each copy to the host waits for the queue (a sync), then
    the host writes. The hooks' checkpoint span and its marks, as ``install_save`` records them."""
    t0 = gpu.now
    marks.save_start(t0)
    gpu.launch(p.save_copy_s, launch_s=0.0002)
    gpu.sync()
    gpu.host(p.save_write_s)
    rows.append({"k": "span", "c": "checkpoint", "t0": t0, "dt": gpu.now - t0, "name": "torch.save"})
    marks.save_end()


def replay(name: str, root: Path, steps: int = 120, nvml: bool = True, tokenize: bool = False,
           trainer_args: dict[str, Any] | None = None) -> Replayed:
    """Play pattern ``name`` through the fake GPU into a recording folder under ``root``.

    ``tokenize``: the main-process batch build is a tokenizer's (counter lines, as the hooks flush them);
    ``trainer_args``: the loop is an HF Trainer's with these ``TrainingArguments``.
    """
    p = PATTERNS[name]
    proc = FakeProcess.begin(root, p.num_workers, BATCH_ROWS, p.queue_s)
    gpu, rows, start = proc.gpu, proc.rows, proc.start
    if trainer_args is not None:
        rows.append({"k": "trainer", "t": start, "args": trainer_args, "version": "4.46.0",
                     "max_steps": steps, "num_train_epochs": 1})
    play(p, proc, steps)
    loop_s = proc.exit(steps, p.build_s)
    if tokenize:
        proc.builder.tokenizer_counters(rows, start_s=start - T0, end_s=gpu.now - T0, total_s=p.build_s * steps)
    b = proc.builder
    if nvml:
        b.gpus_meta = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0}]
        b.gpu = [_nvml_row(gpu, T0 + i / 10) for i in range(1, int(b.duration_s * 10))]
    b.write()
    return Replayed(root, gpu, proc.clock, loop_s, steps)


def _nvml_row(gpu: FakeGpu, t: float) -> dict[str, Any]:
    """What NVML would say for the 100 ms before ``t``: the share of it with a kernel running."""
    util = round(100 * gpu.busy_s(t - 0.1, t) / 0.1)
    return {"t": t, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_pct": float(util),
                              "mem_used_mib": 30000.0, "mem_total_mib": 81559.0, "proc_mem_mib": 30000.0,
                              "lost": False}]}


@dataclass(frozen=True)
class WidthLoop:
    """A training loop on the fake GPU whose kernels scale with the rows' width and whose host
    launches them one by one: the GPU step is about the longer of the two. Rows tokenized to one
    width up front (``padding="max_length"``), copied from pageable memory each step."""

    rows: int = 16
    launches: int = 100  # kernels a step
    host_s: float = 0.008  # the host's own seconds a step: launching them and its Python
    build_s: float = 0.0005  # the batch's fetch on the main process
    fixed_s: float = 0.001  # GPU seconds a step at any width (the optimizer's kernels)
    per_token_s: float = 1.0e-6  # kernels' GPU seconds a token
    per_token2_s: float = 1.0e-9  # and a token times the width (attention)

    def kernels_s(self, width: int) -> float:
        return self.fixed_s + self.rows * width * (self.per_token_s + self.per_token2_s * width)


def play_widths(loop: WidthLoop, root: Path, width: int, lengths: list[list[int]]) -> Replayed:
    """``loop`` at rows padded to ``width`` (each batch's ``lengths`` recorded, cut to it) into a
    recording folder; the model event a GPT-2 class, as a ``transformers`` training records it."""
    proc = FakeProcess.begin(root, 0, loop.rows)
    gpu, rows = proc.gpu, proc.rows
    kernel = loop.kernels_s(width) / loop.launches
    for n, row_lengths in enumerate(lengths, start=1):
        proc.fetch(loop.build_s)
        cut = [min(x, width) for x in row_lengths]
        rows.append({"k": "batch", "t": gpu.now, "tokens": loop.rows * width, "pad": loop.rows * width - sum(cut),
                     "seq_len": width, "lengths": cut})
        proc.copy(0.0002, pageable=True)  # pageable: the copy waits for the step before
        for _ in range(loop.launches):
            gpu.launch(kernel, launch_s=loop.host_s / loop.launches)
        rows.append({"k": "step", "t": gpu.now, "n": n, "dt": 0.0005})
        proc.marks.step_end(n)
    loop_s = proc.exit(len(lengths), loop.build_s)
    proc.builder.write()
    return Replayed(root, gpu, proc.clock, loop_s, len(lengths))
