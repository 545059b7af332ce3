"""Kinds of lines in ``events/<pid>.jsonl`` and ``samples/*.jsonl``.

Every line is one JSON object. Times ``t``/``t0`` are wall-clock epoch seconds
(``time.time()``), so events from different processes line up; durations
``dt``/``s`` are seconds measured with ``time.perf_counter``.

In-process events (key ``k``):

``proc``      once per hooked process: ``pid, ppid, rank, local_rank, world_size,
              argv`` (redacted), ``create_time`` (epoch), ``is_worker``, ``libs``
              ({package: version}), ``python``.
``span``      a timed interval: ``c`` category, ``t0``, ``dt``, ``name``.
              Categories: ``data_wait`` (blocked in ``DataLoader.__next__``; named
              :data:`NO_BATCH_WAIT` when the call gave no batch: the end of the data),
              ``checkpoint`` (torch.save, save_pretrained, safetensors, Trainer
              checkpoints), ``eval`` (Trainer.evaluate, Lightning validation,
              ``gpudoctor.profile().eval()``), ``format`` (``datasets`` map/filter),
              ``data_load`` (``datasets.load_dataset``/``load_from_disk``),
              ``model_load`` (``from_pretrained``), ``save_side`` (a ``torch.save`` of
              an object without tensors, e.g. ``training_args.bin``: saving time, not a
              checkpoint), ``eval_loop`` (a hand-written loop's eval region: forward passes
              without backward, see :mod:`gpudoctor.hooks.eval_regions`). Only the
              outermost span of a category is written when calls nest.
``first_step`` ``t``: start of the first training step (first batch request from a
              DataLoader, or first forward of a module in training mode).
``step``      ``t`` (end of an optimizer step, or of a hand-written parameter update in a
              loop with no optimizer), ``n`` (1-based count), ``dt`` (time inside
              ``optimizer.step``; 0 for a hand-written update).
``loader``    a DataLoader iterator was created: ``id, num_workers, batch_size,
              pin_memory, prefetch_factor, persistent_workers, dataset``,
              ``params`` (the installed DataLoader's argument names), ``item_keys`` (the
              dataset items' keys: a ``datasets`` table's columns or the first item's keys;
              ``[]`` when items are not mappings), ``item_libs`` (the packages of the dataset's
              class, its transforms and the first item's values: ``torchvision``, ``PIL``).
``batch``     padding seen in a training batch: ``t, tokens, pad, seq_len``,
              ``lengths`` (non-pad length of each row; at most 1,024 evenly spaced rows, then
              ``rows`` and ``lengths_max`` give the exact count and longest, see
              :mod:`gpudoctor.common.batchlengths`).
``counter``   periodic totals since the previous counter line: ``t``, ``name``
              (``tokenize`` | ``fetch`` | ``eval_forwards``: forward passes inside
              ``eval_loop`` regions), ``calls``, ``s`` (seconds). Written every
              0.5 s while the process is young, then every age/60 s up to 10 s,
              at the first step and at exit (see :mod:`gpudoctor.hooks.writer`). ``fetch`` is the
              time a process spent producing batches (dataset ``__getitem__`` +
              collate), in the main process or in a DataLoader worker.
``torch_cfg`` at the first training forward: ``cuda`` (bool), ``device``, ``device_name``,
              ``device_capability`` ([major, minor]),
              ``matmul_precision``, ``allow_tf32``, ``cudnn_allow_tf32``,
              ``param_dtype``, ``autocast`` (bool), ``autocast_dtype``.
``model``     at the first training forward, when the model has a ``config.to_dict()``
              (Hugging Face): ``class``, ``params`` (parameter count), ``config`` (its numbers,
              switches and ``model_type`` only; read by ``gpudoctor replay RUN``).
``trainer``   Hugging Face Trainer seen: ``args`` (TrainingArguments.to_dict(),
              redacted; its keys are the installed version's field names),
              ``max_steps``, ``num_train_epochs``, ``version``.
``uncaught``  the exception that ended the process (``sys.excepthook``): ``t``, ``error`` (its
              type), ``message`` (redacted, short), ``frames`` (the last few, ``file:line in fn``);
              with a frame of gpudoctor's in the traceback, ``doctor_frames`` (ours, from the
              package root) and ``doctor_raised`` (the exception came from our own code).
``lightning_checkpoint`` a Lightning ``ModelCheckpoint`` was built: ``t``, ``args``
              (``every_n_train_steps``, ``every_n_epochs``, ``train_time_interval``, ``save_top_k``,
              ``save_weights_only``, ``save_last``, ``monitor``), ``params`` (the installed
              ``ModelCheckpoint.__init__``'s argument names), ``class``, ``version`` (Lightning's).
``accelerator`` an Accelerate ``Accelerator`` was built: ``t``, ``params`` (the installed
              ``__init__``'s argument names), ``mixed_precision``, ``gradient_accumulation_steps``,
              ``version``.
``cli``       the script's own options, so a fix can name its flag: ``style``
              (``argparse``: a parse, HfArgumentParser's included; ``globals``: literal
              module globals a configurator overrides from ``--key=value``), ``parser``,
              ``from_argv`` (parsed ``sys.argv``), ``args`` (redacted, when another list
              was parsed), ``options``: ``[{dest, flags, default, value, takes_value,
              const, choices}]``, values redacted (see :mod:`gpudoctor.hooks.cli_hooks`).
``profiler``  a short torch.profiler window: ``t0, dt, steps``, ``dataloader_s``
              (time in DataLoader ``__next__`` events), ``cuda_kernel_s`` (null on CPU).
``exit``      the process is exiting normally: ``t``.
``detach``    ``attach`` took its hooks out of the process: ``t``.
``plan``      how long the training means to run, from the HF Trainer or Lightning
              (at train begin, or when ``attach`` adopts a Trainer mid-run): ``t,
              max_steps, num_train_epochs, global_step``. Older recordings call it
              ``hf_plan``; both are read.
``map_cache`` after each ``datasets.Dataset.map``: ``t``, ``state``: ``hit`` (its result was
              read from the datasets cache), ``miss`` (computed and now cached: the next
              launch can read it), ``none`` (an in-memory dataset, never cached).
``hook_error`` one of our hooks failed and switched off (the training went on): ``t``,
              ``where``, ``vital`` (the whole in-process recording stopped), ``error``,
              ``message`` (redacted). The report says so in a ``partial_recording`` note.

GPU clock (in-process, CUDA runs only; see :mod:`gpudoctor.hooks.device_clock`). Seconds
named ``gpu_s``/``idle_s``/``*_idle_s``/``h2d_s`` are measured on the GPU by CUDA events; the
others on the host:

``gpu_clock`` once, when the first training forward runs on CUDA: ``t``, ``device``, ``source``
              (``cuda_events``).
``gpu_wait``  one DataLoader wait: ``t0``, ``dt`` (host), ``idle_s`` (the part of it the GPU
              sat idle: ``elapsed(W0, W1)``, nothing being queued during a wait).
``gpu_step``  one step end, written once the GPU passed it: ``t`` (host), ``n``, ``gpu_s`` (GPU
              time since the previous step's reference: its first wait's end, or its end
              when it had no wait; null for the first), ``waits``,
              ``wait_idle_s``, ``syncs``, ``sync_block_s`` (host seconds blocked in them),
              ``sync_idle_s`` (GPU idle after them, at most), ``h2d``, ``h2d_s`` (copies on the
              GPU), ``h2d_block_s`` (host blocked in them), ``saves``, ``save_s`` (the GPU's
              part of checkpoint saves), ``comms``, ``comm_wait_s`` (DDP backwards whose all-reduce
              was timed, and the training stream's wait for it after the last bucket's launch:
              the exposed all-reduce under NCCL; only when DDP ran on CUDA), ``gathers``,
              ``gather_wait_s``, ``gathers_bwd``, ``gather_bwd_wait_s``, ``rs_wait_s`` (FSDP2 on
              CUDA: the training stream's waits for its all-gathers, those inside backward, and
              for the last reduce-scatters at the end of backward), ``dropped`` (marks not recorded).
``cuda_mem``  the CUDA caching allocator at a step end (``torch.cuda.memory_stats``: host-side
              counters, no sync; see :mod:`gpudoctor.hooks.cuda_memory`), at most every 0.5 s after
              the first steps: ``t``, ``n`` (the step), ``allocated_mib`` (live tensors),
              ``reserved_mib`` (held by the allocator: live tensors and cached blocks),
              ``peak_mib`` (the most ever allocated: ``max_memory_allocated``, never reset by us),
              ``total_mib`` (the device's memory, first line only).
``gpu_save``  one checkpoint ``torch.save``: ``t0``, ``dt`` (host), ``idle_s`` (the save's part on
              the GPU, ``elapsed(S0, S1)``: its copies and the idle while it writes).

Data parallelism (in-process; see :mod:`gpudoctor.hooks.comm_hooks`):

``ddp``       a ``DistributedDataParallel`` was built: ``t``, ``find_unused_parameters``,
              ``static_graph``, ``gradient_as_bucket_view``, ``bucket_cap_mb``, ``world_size``,
              ``backend``, ``params`` (parameters that require a gradient), ``param_bytes``,
              ``device``.
``comm``      one optimizer step's collectives, aggregated: ``t``, ``n`` (the step),
              ``micro`` (DDP training forwards since the last step), ``synced`` (those that
              all-reduce their gradients, i.e. not under ``no_sync()``), ``buckets`` (gradient
              buckets all-reduced), ``bytes``, ``comm_s`` (seconds some gradient bucket was in flight,
              launch to completion), ``exposed_s`` (host seconds after backward's last bucket was
              launched until every bucket completed: the all-reduce not hidden behind backward;
              null where the host does not wait, e.g. NCCL on CUDA), ``search_s`` (seconds in
              DDP's post-forward when ``find_unused_parameters`` searches the graph),
              ``direct`` / ``direct_bytes`` / ``direct_s`` (``torch.distributed`` calls made by the
              script or FSDP: all_reduce, all_gather, broadcast, barrier...: count, bytes, host
              seconds of the synchronous ones), ``unused_params`` (parameters of DDP models with
              no gradient at the first step; only on that step); once FSDP's all-gathers were
              seen: ``fsdp`` (1, or 2 for ``fully_shard``), ``gather_bwd`` / ``gather_bwd_bytes`` /
              ``gather_bwd_s`` (all-gathers inside backward: parameters gathered again after the
              forward resharded them; host seconds of the blocking ones on CPU tensors).
              Exposed seconds are also written as ``span`` events of category
              ``communication`` (one per synced backward, one per blocking direct call).

Sampler lines (no ``k``): see :mod:`gpudoctor.samplers.host` and
:mod:`gpudoctor.samplers.nvml` for the fields.

The TypedDicts at the end of this module are the format itself: :meth:`EventWriter.emit` takes an
:data:`Event`, and the loader's checks (``validate.EVENT_FIELDS``) are derived from them. A new
kind or field is added there (the list above says what it means).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

# Names the analysis reads and the hooks write (the hooks import them from here, not back).
SIDE_FILE = "save_side"  # span category: a torch.save of an object without tensors
COMMUNICATION = "communication"  # span category: collectives the host waited for (exposed)
EVAL_LOOP = "eval_loop"  # span category: a hand-written loop's eval region
EVAL_FORWARDS = "eval_forwards"  # counter: forward passes inside eval_loop regions


# ---- the vocabulary as types -----------------------------------------------------------------
# Stdlib only: the injected hooks import this module inside the patient. Each kind is a TypedDict:
# its required keys are the ones the analysis needs (a line without one is dropped), the optional
# ones may be absent or, where ``| None``, null. The ``Annotated`` marks say what a number is, and
# gpudoctor/recording/validate.py derives its checks (EVENT_FIELDS) from them.

Time = Annotated[float, "time"]  # epoch seconds, time.time()
Seconds = Annotated[float, "duration"]  # a duration, time.perf_counter() differences
Count = Annotated[int, "count"]  # a non-negative whole number
Int = Annotated[int, "int"]  # a whole number, maybe negative (a pid, a rank, -1 steps)
Number = Annotated[float, "number"]  # any finite number
Counts = Annotated[list[int], "count_list"]
Libs = Annotated[dict[str, str | None], "libs"]  # {package: version or None}
Unchecked = Annotated[Any, "unchecked"]  # written, read by some, never checked on load


# A loader wait that delivered no batch (``StopIteration`` at the end of the data, or an error):
# its seconds are data wait, but it is not one of the batches the loop trained on (the batches per
# step that MFU's tokens and the per-batch figures count).
NO_BATCH_WAIT = "DataLoader.__next__ (no batch)"


class CliOption(TypedDict, total=False):
    dest: str
    flags: list[str]
    default: Any
    value: Any
    takes_value: bool
    const: Any
    choices: list[str | int] | None  # argparse's choices, when a short list of words or numbers


Options = Annotated[list[CliOption], "options"]


class _Span(TypedDict):
    k: Literal["span"]
    c: str
    t0: Time
    dt: Seconds


class SpanEvent(_Span, total=False):
    name: str


class _Step(TypedDict):
    k: Literal["step"]
    t: Time


class StepEvent(_Step, total=False):
    n: Count
    dt: Seconds | None


class FirstStepEvent(TypedDict):
    k: Literal["first_step"]
    t: Time


class _Exit(TypedDict):
    k: Literal["exit"]
    t: Time


class ExitEvent(_Exit, total=False):
    writer_cpu_s: Unchecked  # what recording cost this process beside its hooks (bench/ reads it)
    events_written: Unchecked


class _Detach(TypedDict):
    k: Literal["detach"]
    t: Time


class DetachEvent(_Detach, total=False):
    writer_cpu_s: Unchecked  # what recording cost this process beside its hooks (bench/ reads it)
    events_written: Unchecked


class MapCacheEvent(TypedDict):
    k: Literal["map_cache"]
    t: Time
    state: str


class _HookError(TypedDict):
    k: Literal["hook_error"]
    t: Time
    where: str


class HookErrorEvent(_HookError, total=False):
    vital: bool | None
    error: str | None
    message: str | None


class _Counter(TypedDict):
    k: Literal["counter"]
    t: Time
    name: str
    calls: Count
    s: Seconds


class CounterEvent(_Counter, total=False):
    # what the calls were made of (analysis/buildcost.py): process CPU (all threads), this
    # thread's CPU, and this thread's wait for a core (/proc/thread-self/schedstat)
    cpu: Seconds
    tcpu: Seconds
    rdelay: Seconds


class _Batch(TypedDict):
    k: Literal["batch"]
    tokens: Count
    pad: Count
    seq_len: Count


class BatchEvent(_Batch, total=False):
    t: Time
    lengths: Counts  # at most 1,024 sampled rows (common/batchlengths.py)
    rows: Count  # the batch's exact row count when lengths is a sample
    lengths_max: Count  # its exact longest row


class _Proc(TypedDict):
    k: Literal["proc"]


class ProcEvent(_Proc, total=False):
    t: Time
    pid: Int
    ppid: Int | None
    rank: Int | None
    local_rank: Int | None
    world_size: Int | None
    argv: list[str]
    create_time: Time | None
    is_worker: bool | None
    libs: Libs
    python: str | None
    sampled: bool  # a stand-in made from stack samples (analysis/sampled.py); the hooks never write it


class _Loader(TypedDict):
    k: Literal["loader"]


class LoaderEvent(_Loader, total=False):
    t: Time
    id: Int | None
    num_workers: Count | None
    batch_size: Count | None
    pin_memory: bool | None
    prefetch_factor: Count | None
    persistent_workers: bool | None
    dataset: str | None
    collate_fn: str | None
    params: list[str]
    pid: Int | None
    dataset_len: Count | None  # len(dataset) when it has one
    # the training items' keys (hooks/dataset_items.py): a datasets table's columns, else None
    item_keys: list[str] | None
    # the packages its items are made with (their transforms, values): "torchvision", "PIL"
    item_libs: list[str]
    # every row's token length of a ``datasets`` table (hooks/dataset_items.row_lengths): the upper
    # edge of each non-empty 8-token bucket and its rows
    length_edges: Counts
    length_counts: Counts


class _TorchCfg(TypedDict):
    k: Literal["torch_cfg"]


class TorchCfgEvent(_TorchCfg, total=False):
    t: Time
    cuda: bool | None
    device: str | None
    device_name: str | None
    device_capability: Counts | None
    matmul_precision: str | None
    allow_tf32: bool | None
    cudnn_allow_tf32: bool | None
    param_dtype: str | None
    autocast: bool | None
    autocast_dtype: str | None
    threads: Count | None  # torch's intra-op threads at the first training forward
    module: str | None
    libs: Libs


class _Trainer(TypedDict):
    k: Literal["trainer"]


class TrainerEvent(_Trainer, total=False):
    t: Time
    args: dict[str, Any]
    max_steps: Int | None
    num_train_epochs: Number | None
    version: str | None


# ``class`` is a keyword: the optional part is spelt the functional way.
_ModelOptional = TypedDict("_ModelOptional", {"t": Time, "class": str | None, "params": Count | None,
                                              # the FLOPs model's sizes from parameter shapes
                                              # (analysis/workload.py): matmul_params, n_layers,
                                              # hidden, attention
                                              "shape": dict[str, Any] | None},
                           total=False)


class ModelEvent(_ModelOptional):
    k: Literal["model"]
    config: dict[str, Any]


class _Plan(TypedDict):
    k: Literal["plan", "hf_plan"]  # ``hf_plan``: the same, as older recordings name it


class PlanEvent(_Plan, total=False):
    t: Time
    max_steps: Int | None
    num_train_epochs: Unchecked
    global_step: Unchecked
    # Lightning's Trainer (hooks/lightning_callback.py): its eval and precision settings
    framework: Unchecked
    val_check_interval: Unchecked
    limit_val_batches: Unchecked
    check_val_every_n_epoch: Unchecked
    precision: Unchecked
    version: Unchecked


class _Cli(TypedDict):
    k: Literal["cli"]
    options: Options


class CliEvent(_Cli, total=False):
    t: Time
    style: str
    parser: str | None
    from_argv: bool
    args: list[str] | None


class _Profiler(TypedDict):
    k: Literal["profiler"]
    t0: Time
    dt: Seconds


class ProfilerEvent(_Profiler, total=False):
    steps: Count
    dataloader_s: Seconds | None
    cuda_kernel_s: Seconds | None


# Kinds written for tools beside the analysis; kept as they are on load, never checked.
class AppliedEvent(TypedDict):
    k: Literal["applied"]
    t: float
    rule: str
    call: str
    values: dict[str, Any]
    was: dict[str, Any]
    skipped: dict[str, str]
    pid: int


class _Tracker(TypedDict):
    k: Literal["tracker"]
    t: float
    kind: str
    pid: int


class TrackerEvent(_Tracker, total=False):
    run_id: str | None
    experiment_id: str | None
    project: str | None
    name: str | None
    url: str | None
    tracking_uri: str | None
    log_dir: str | None


class HfProgressEvent(TypedDict):
    k: Literal["hf_step", "hf_end"]
    t: float
    global_step: Any



# GPU clock (hooks/device_clock.py): CUDA runs only.
class _GpuClock(TypedDict):
    k: Literal["gpu_clock"]
    t: Time


class GpuClockEvent(_GpuClock, total=False):
    device: str | None
    source: str | None  # "cuda_events", or the fake clock's class name in tests


class GpuWaitEvent(TypedDict):
    k: Literal["gpu_wait"]
    t0: Time  # the host wait span's own start
    dt: Seconds  # host seconds
    idle_s: Seconds  # GPU seconds idle inside it


class GpuSaveEvent(TypedDict):
    k: Literal["gpu_save"]
    t0: Time  # the checkpoint save's host start
    dt: Seconds  # host seconds, torch.save alone
    idle_s: Seconds  # the save's part on the GPU (copies, then idle)


class _GpuStep(TypedDict):
    k: Literal["gpu_step"]
    t: Time
    gpu_s: Seconds | None  # GPU seconds since the previous step's reference; None for the first


class GpuStepEvent(_GpuStep, total=False):
    n: Count
    waits: Count
    wait_idle_s: Seconds
    syncs: Count
    sync_block_s: Seconds
    sync_idle_s: Seconds  # at most
    h2d: Count
    h2d_s: Seconds
    h2d_block_s: Seconds
    saves: Count
    save_s: Seconds
    comms: Count  # DDP backwards whose all-reduce was timed on the GPU
    comm_wait_s: Seconds  # the training stream's wait for it after backward's last bucket
    gathers: Count  # FSDP unshards waited for on the training stream
    gather_wait_s: Seconds  # ... the stream's wait for their all-gathers (copy-out included)
    gathers_bwd: Count  # ... of them inside backward: re-gathers
    gather_bwd_wait_s: Seconds
    rs_wait_s: Seconds  # FSDP's end of backward: the stream's wait for the last reduce-scatters
    dropped: Count



class _CudaMem(TypedDict):
    k: Literal["cuda_mem"]
    t: Time
    allocated_mib: Number
    reserved_mib: Number
    peak_mib: Number


class CudaMemEvent(_CudaMem, total=False):
    n: Count
    total_mib: Number | None  # the device's memory (torch's figure), on the first line



class _Uncaught(TypedDict):
    k: Literal["uncaught"]
    t: Time
    error: str


class UncaughtEvent(_Uncaught, total=False):
    message: str | None
    frames: list[str]
    doctor_frames: list[str]  # gpudoctor's own frames in the traceback (innermost last), when any
    doctor_raised: bool  # ... and the exception came from one of them (gpudoctor's bug)


class _LightningCheckpoint(TypedDict):
    k: Literal["lightning_checkpoint"]
    args: dict[str, Any]


_LightningCheckpointOptional = TypedDict("_LightningCheckpointOptional", {
    "t": Time, "version": str | None, "params": list[str], "class": str | None}, total=False)


class LightningCheckpointEvent(_LightningCheckpoint, _LightningCheckpointOptional):
    pass


class _Accelerator(TypedDict):
    k: Literal["accelerator"]


class AcceleratorEvent(_Accelerator, total=False):
    """Accelerate's ``Accelerator`` as built (hooks/accelerate_hooks.py)."""

    t: Time
    params: list[str]  # the installed ``Accelerator.__init__``'s argument names
    mixed_precision: str | None  # "no", "fp16", "bf16", "fp8"
    gradient_accumulation_steps: Int | None
    version: str | None



class _Ddp(TypedDict):
    k: Literal["ddp"]
    t: Time


class DdpEvent(_Ddp, total=False):
    """A ``DistributedDataParallel`` as built (hooks/comm_hooks.py)."""

    find_unused_parameters: bool
    static_graph: bool
    gradient_as_bucket_view: bool
    bucket_cap_mb: Number | None
    world_size: Count | None
    backend: str | None
    params: Count
    param_bytes: Count
    device: str | None


class _Comm(TypedDict):
    k: Literal["comm"]
    t: Time


class CommEvent(_Comm, total=False):
    """One optimizer step's collectives (hooks/comm_hooks.py)."""

    n: Count
    micro: Count
    synced: Count
    buckets: Count
    bytes: Count
    comm_s: Seconds
    exposed_s: Seconds | None
    search_s: Seconds
    direct: Count
    direct_bytes: Count
    direct_s: Seconds
    unused_params: Count
    fsdp: Count  # 1 or 2 (``fully_shard``): FSDP's all-gathers were seen in this process
    gather_bwd: Count  # all-gathers inside backward: FSDP re-gathering what the forward resharded
    gather_bwd_bytes: Count
    gather_bwd_s: Seconds  # ... the host's seconds in them (blocking calls on CPU tensors; 0 on CUDA)


# The kinds the loader checks (validate.EVENT_FIELDS is derived from these), by ``k``.
CHECKED: dict[str, type] = {
    "span": SpanEvent,
    "step": StepEvent,
    "first_step": FirstStepEvent,
    "exit": ExitEvent,
    "detach": DetachEvent,
    "map_cache": MapCacheEvent,
    "hook_error": HookErrorEvent,
    "counter": CounterEvent,
    "batch": BatchEvent,
    "proc": ProcEvent,
    "loader": LoaderEvent,
    "torch_cfg": TorchCfgEvent,
    "trainer": TrainerEvent,
    "model": ModelEvent,
    "plan": PlanEvent,
    "hf_plan": PlanEvent,
    "cli": CliEvent,
    "profiler": ProfilerEvent,
    "gpu_clock": GpuClockEvent,
    "gpu_wait": GpuWaitEvent,
    "gpu_step": GpuStepEvent,
    "gpu_save": GpuSaveEvent,
    "cuda_mem": CudaMemEvent,
    "uncaught": UncaughtEvent,
    "lightning_checkpoint": LightningCheckpointEvent,
    "accelerator": AcceleratorEvent,
    "ddp": DdpEvent,
    "comm": CommEvent,
}

Event = (
    SpanEvent | StepEvent | FirstStepEvent | ExitEvent | DetachEvent | MapCacheEvent | HookErrorEvent
    | CounterEvent | BatchEvent | ProcEvent | LoaderEvent | TorchCfgEvent | TrainerEvent | ModelEvent
    | PlanEvent | CliEvent | ProfilerEvent | AppliedEvent | TrackerEvent | HfProgressEvent
    | GpuClockEvent | GpuWaitEvent | GpuStepEvent | GpuSaveEvent | CudaMemEvent | UncaughtEvent | LightningCheckpointEvent
    | AcceleratorEvent | DdpEvent | CommEvent
)
"""One line of ``events/<pid>.jsonl``, as the hooks write it (:meth:`EventWriter.emit`)."""
