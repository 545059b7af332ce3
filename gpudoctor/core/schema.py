"""The report dict every renderer consumes (and ``report.json`` stores), as types.

``gpudoctor.report/1``: :class:`Report` and the TypedDicts below are the whole schema, the one
place its fields are written down. ``gpudoctor report``, ``check`` and ``diff`` validate a
report.json against them (:func:`gpudoctor.report.check.problem`), so the renderers and the CI
gate get what the types say or one clear line. TypedDicts, not classes: a report stays a plain
dict that ``json`` writes and reads as it is, and pydantic validates it without a copy to keep.

Constraints ride on the types (``Annotated`` with :mod:`annotated_types`, which pydantic reads):
a fraction of the wall time lies in [0, 1], money and seconds are >= 0 and below an absurd
bound, every number is finite, ``true`` is not a number and ``"3"`` not a count (strict). A
forged ``wasted_fraction`` of -3 would pass the CI gate, a 1e308 would overflow the renderers.

Compatibility: keys this version does not know (a newer gpudoctor's) are allowed and ignored,
so an older gpudoctor still reads a newer report of the same schema id. Sections and fields
added after the first release are ``NotRequired``: a report written before them still loads.

Optional sections go through :data:`SECTIONS`, the one registry ``gpudoctor report FOLDER``
(what a re-render keeps), the renderers (:mod:`gpudoctor.render.sections`) and ``diff``
consult. ``sweep`` and ``merge`` are not report sections: ``gpudoctor sweep`` writes its own
``sweep.json`` (``gpudoctor.sweep/1``) and ``--merge`` joins those.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from annotated_types import Ge, Le, Len
from typing_extensions import NotRequired, TypedDict

from gpudoctor.common.numbers import num

SCHEMA: Literal["gpudoctor.report/1"] = "gpudoctor.report/1"
BREAKDOWN_KEYS = ("startup", "data_wait", "compute", "communication", "checkpoint", "eval", "other")
OPTIONAL_BUCKETS = ("communication",)  # added later: older reports lack it (it was inside compute)
SEVERITIES = ("high", "medium", "low", "info")
# What happened to a finding between two reports (``gpudoctor diff``; gpudoctor/report/diff.py).
DIFF_STATUSES = ("resolved", "partial", "moved", "gone", "new", "still_present")

MAX_USD = 1e9  # per hour or per run: beyond it the figure is forged or corrupt
MAX_SECONDS = 1e8  # ~3 years of wall time
MAX_SPEEDUP = 1e6  # also the most steps/s: beyond it the figure is forged or corrupt
MAX_COUNT = 1e12  # steps, batches, samples, tokens, parameters


@dataclass(frozen=True)
class Says:
    """What a constrained figure is, for the one-line refusal (``cost.usd_per_hour is not ...``)."""

    text: str


Fraction = Annotated[float, Ge(0.0), Le(1.0), Says("a fraction from 0 to 1")]
Usd = Annotated[float, Ge(0.0), Le(MAX_USD), Says(f"a number of dollars from 0 to {MAX_USD:g}")]
Seconds = Annotated[float, Ge(0.0), Le(MAX_SECONDS), Says(f"a number of seconds from 0 to {MAX_SECONDS:g}")]
# Timeline and profiler times: seconds since the launch or the attach; an attach report's window
# may start before the attach (its launch), so these may be negative.
Offset = Annotated[float, Ge(-MAX_SECONDS), Le(MAX_SECONDS), Says(f"a time in seconds within ±{MAX_SECONDS:g}")]
Speedup = Annotated[float, Ge(0.0), Le(MAX_SPEEDUP), Says(f"a number from 0 to {MAX_SPEEDUP:g}")]
Count = Annotated[int, Ge(0), Le(MAX_COUNT), Says(f"a whole number from 0 to {MAX_COUNT:g}")]
Amount = Annotated[float, Ge(0.0), Le(MAX_COUNT), Says(f"a number from 0 to {MAX_COUNT:g}")]
Percent = Annotated[float, Ge(0.0), Le(1e4), Says("a percentage from 0 to 10000")]  # CPU %: one core is 100
Figure = Annotated[float, Ge(-1e15), Le(1e15), Says("a finite number")]
Severity = Literal["high", "medium", "low", "info"]
Bucket = Literal["startup", "data_wait", "compute", "communication", "checkpoint", "eval", "other"]
Span = Annotated[list[Offset], Len(2, 2)]  # [start, end]
SpeedupRange = Annotated[list[Speedup], Len(2, 2)]  # [conservative, optimistic]


# --- run ---------------------------------------------------------------------------------------


class Gpu(TypedDict, total=False):
    index: int
    name: str | None
    memory_total_mib: Amount | None


class DoctorFault(TypedDict):
    """The training crashed with gpudoctor's code in its traceback (issue #39): ``raised``, the
    exception came from our own frame (our bug); else it passed through a wrapper of ours.
    ``frames``: our frames, innermost last (``gpudoctor/hooks/torch_hooks.py:97 in save``)."""

    raised: bool
    frames: list[str]


class Run(TypedDict):
    """Where and how the run happened. ``status``: finished, crashed, interrupted, partial (the doctor
    never finalized it); ``mode``: run, attach, replay, try, profile, callback ..."""

    mode: NotRequired[str]
    command: NotRequired[list[str]]
    pid: NotRequired[int | None]
    started_at: NotRequired[str | None]
    duration_s: Seconds | None
    host: NotRequired[dict[str, Any]]
    gpus: NotRequired[list[Gpu]]
    gpu_count: NotRequired[int | None]
    price_per_gpu_hour_usd: NotRequired[Usd | None]
    exit_code: NotRequired[int | None]
    status: NotRequired[str]
    gpudoctor_version: NotRequired[str]
    doctor_priority: NotRequired[dict[str, str] | None]  # how the doctor kept out of the way; null: in-process
    doctor_fault: NotRequired[DoctorFault]  # a crash through gpudoctor's own code; absent: none


# --- what the time went to ---------------------------------------------------------------------


class Breakdown(TypedDict, total=False):
    """Each instant of wall time in one slice; null slices when no process was hooked."""

    startup: Fraction | None
    data_wait: Fraction | None
    compute: Fraction | None
    communication: Fraction | None  # collectives the host waited for, not hidden behind backward
    checkpoint: Fraction | None
    eval: Fraction | None
    other: Fraction | None


class Shares(TypedDict, total=False):
    """Overlapping shares of wall time. ``tokenization`` sums tokenizer seconds over threads and
    worker-free processes, so it is >= 0 but not capped at 1."""

    tokenization: Annotated[float, Ge(0.0), Le(1e3), Says("a share from 0 to 1000")] | None
    gpu_busy: Fraction | None
    cpu_busy: Fraction | None  # the training processes' CPU as a share of all the machine's cores


class Padding(TypedDict, total=False):
    pad_fraction: Fraction | None
    max_length: Count | None
    p50_length: Count | None
    p99_length: Count | None
    batches_seen: Count


class StepTimes(TypedDict, total=False):
    p50: Seconds | None
    p90: Seconds | None


class Steps(TypedDict, total=False):
    count: Count
    first_step_at_s: Offset | None
    step_time_s: StepTimes


class Saves(TypedDict):
    """Each save counted once, by kind (:mod:`gpudoctor.analysis.saves`)."""

    checkpoints: Count
    checkpoint_s: Seconds
    final: Count
    final_s: Seconds
    side_files: Count
    side_files_s: Seconds


# --- findings ----------------------------------------------------------------------------------


class FixTable(TypedDict, total=False):
    """One call a fix changes: ``config`` holds the arguments of ``library``'s ``call``
    (e.g. "transformers 5.23.0 TrainingArguments"), or a script's flags (keys ``--name``)."""

    library: str | None
    call: str | None
    config: dict[str, Any] | None


class FixMemory(TypedDict):
    """The predicted peak of a fix that changes the work per step (a larger batch, shorter rows), from
    the activation memory measured in this run (:class:`gpudoctor.analysis.memory.StepMemory`); both
    figures null where the run could not measure it (a CPU run, no allocator figures), ``basis`` says
    how or why not."""

    predicted_peak_mib: Amount | None  # the CUDA allocator's peak with the fix
    headroom_mib: float | None  # what stays under the limit at that peak (negative: it would not fit)
    limit_mib: Amount | None  # the share of the device a fix may reach, less the CUDA context
    basis: str


class Fix(FixTable, total=False):
    summary: str
    snippet: str | None
    also: list[FixTable]  # other calls the same fix changes, one table each
    memory: FixMemory  # only on fixes that change the work per step


class Claim(TypedDict):
    """Seconds of the breakdown a fix gives back (:mod:`gpudoctor.rules.account`)."""

    bucket: Bucket
    part: NotRequired[str | None]
    part_share: Fraction
    fraction: Fraction


class Finding(TypedDict):
    """``waste_fraction`` and the speedups are the finding's ``claims`` settled alone:
    ``predicted_speedup`` the training loop's steady-state steps/s after the fix over before (null
    for a fix of startup alone), ``whole_run_speedup`` this recording's wall time before over after
    (startup included); ``predicted_speedup_range`` ([lo, hi], steady state) when the gain depends
    on something unmeasured;
    ``data`` the figures the evidence cites; ``waste_usd_per_hour`` null without a price."""

    rule: str
    severity: Severity
    title: NotRequired[str]
    waste_fraction: Fraction
    waste_usd_per_hour: NotRequired[Usd | None]
    evidence: NotRequired[str]
    data: NotRequired[dict[str, Any]]
    fix: Fix
    predicted_speedup: NotRequired[Speedup | None]
    whole_run_speedup: NotRequired[Speedup | None]
    predicted_speedup_range: NotRequired[SpeedupRange | None]
    claims: NotRequired[list[Claim]]
    risk: NotRequired[bool]  # a risk with a deadline (memory that runs out), not wasted time: no claims


class Cost(TypedDict):
    """Dollar figures are null when no price is known (no GPU seen and none given);
    ``wasted_fraction`` is every finding's claims settled together."""

    usd_per_hour: NotRequired[Usd | None]
    wasted_usd_per_hour: NotRequired[Usd | None]
    wasted_fraction: Fraction | None
    wasted_usd_so_far: NotRequired[Usd | None]
    projected_run_hours: NotRequired[Annotated[float, Ge(0.0), Le(MAX_SECONDS / 3600),
                                               Says("a number of hours from 0 to 27778")] | None]
    projected_run_usd: NotRequired[Usd | None]
    projected_wasted_usd: NotRequired[Usd | None]
    price_source: NotRequired[str]


# --- per rank, timeline, profiler --------------------------------------------------------------


class RankSteps(TypedDict, total=False):
    count: Count
    step_time_s: StepTimes


class RankEntry(TypedDict, total=False):
    """One training process (a single process is rank 0). A merged multi-node report adds its
    ``node``, ``local_rank``, and its ``data_wait_s``, ``communication_s``, ``checkpoint_s`` and ``wall_s`` in
    seconds."""

    rank: int | None
    pid: int | None
    breakdown: Breakdown
    steps: RankSteps
    node: str
    local_rank: int | None
    data_wait_s: Seconds
    communication_s: Seconds  # collectives it waited for (merged multi-node reports)
    checkpoint_s: Seconds
    wall_s: Seconds


class Series(TypedDict, total=False):
    """Host and GPU samples, downsampled to at most 2000 points."""

    t_s: list[Offset]
    cpu_pct: list[Percent | None]  # the training process tree, 100 = one core busy; shown as % of all cores
    rss_mib: list[Amount | None]
    gpu_busy_pct: list[Percent | None] | None
    gpu_t_s: list[Offset] | None
    gpu_mem_mib: list[Amount | None] | None  # the training processes' GPU memory (NVML), at gpu_t_s
    alloc_t_s: list[Offset] | None  # the CUDA caching allocator at step ends (the primary process)
    alloc_allocated_mib: list[Amount] | None  # live tensors, at alloc_t_s
    alloc_reserved_mib: list[Amount] | None  # held by the allocator (live tensors and cached blocks)



class Timeline(TypedDict, total=False):
    """Seconds since the launch (``origin`` "launch") or the attach ("attach"), downsampled."""

    duration_s: Seconds
    series: Series
    spans: dict[str, list[Span]]  # startup, data_wait, checkpoint, eval, format: [[start, end]]
    steps_t_s: list[Offset]
    origin: Literal["launch", "attach"]
    caption: str


class ProfilerWindow(TypedDict):
    """One short torch.profiler window the hooks opened (:mod:`gpudoctor.hooks.profiler_windows`):
    a cross-check of the hooks' own figures from a second instrument. ``dataloader_s`` is the
    profiler's ``DataLoader.__next__`` time in the window (compare with the breakdown's data wait);
    ``cuda_kernel_busy`` the share of the window GPU kernels ran (null on CPU)."""

    rank: int | None
    t_s: Offset
    duration_s: Seconds
    steps: Count | None
    dataloader_s: Seconds
    cuda_kernel_busy: Annotated[float, Ge(0.0), Le(1e3), Says("a share from 0 to 1000")] | None


# --- sections other modes add ------------------------------------------------------------------


class Attach(TypedDict):
    """``gpudoctor attach``: what was loaded into which process, from when, what is estimated
    (:mod:`gpudoctor.report.attach`); its lines also lead ``notes``, which every format prints."""

    attached_at: str | None  # None where the recorded time is no calendar date
    process_age_s: Seconds | None
    window_start_s: Offset
    loaded: list[str]
    window: str
    estimated: list[str]
    notes: list[str]


class PreflightTarget(TypedDict, total=False):
    """The GPU the run is predicted on: :class:`gpudoctor.common.hardware.GpuSpec`'s fields, in its
    order, the price the prediction used, the GPUs and CPU cores (``gpudoctor.replay.preflight``)."""

    key: str
    name: str
    bf16_tflops: Figure | None
    fp16_tflops: Figure | None
    tf32_tflops: Figure | None
    fp32_tflops: Figure
    memory_gb: Figure
    bandwidth_gb_s: Figure
    price_per_gpu_hour: Usd
    source: str
    date: str
    price_source: str
    gpus: int
    cpu_cores: int


class PreflightFix(TypedDict, total=False):
    rule: str
    config: dict[str, Any]
    summary: str
    saves_h: Figure


class Preflight(TypedDict):
    """``gpudoctor replay --target``: the full run predicted on a GPU not rented yet, before and
    after the fixes (``gpudoctor.preflight/1``, :mod:`gpudoctor.replay.preflight`). ``before`` and
    ``after`` hold every figure of the cost model (``wall_h``, ``cost_usd``, ``step_s`` ...)."""

    schema: NotRequired[str]
    target: PreflightTarget
    assumptions: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any]
    fixes: list[PreflightFix]
    speedup: Speedup
    saved_usd: Annotated[float, Ge(-MAX_USD), Le(MAX_USD), Says(f"a number of dollars within ±{MAX_USD:g}")]
    notes: list[str]


class CheckRow(TypedDict):
    figure: str
    unit: str  # "s", "fraction", "per_s"
    predicted: Figure | None
    measured: Figure | None
    measured_over_predicted: Figure | None


class PredictionCheck(TypedDict):
    """A replay that ran on a GPU: the preflight model's prediction for this GPU beside what the
    replay measured (:mod:`gpudoctor.replay.here`); ``known`` false when the GPU is not in the table."""

    gpu: str | None
    known: bool
    target: NotRequired[str]
    mfu_assumed: NotRequired[Fraction]
    mfu_achieved: NotRequired[Figure | None]
    precision: NotRequired[str]
    rows: list[CheckRow]
    notes: list[str]


class Rate(TypedDict, total=False):
    steps_per_s: Speedup | None
    steps: Count
    warmup_steps: Count
    window_s: Seconds | None


class Pair(TypedDict, total=False):
    """One before/after pair of ``try --pairs N``: the command as it ran, then with the fix, back to back."""

    baseline_steps_per_s: Speedup | None
    trial_steps_per_s: Speedup | None
    speedup: Speedup | None
    folder: str  # under the run folder: the first pair is the run folder and ``trial/``
    unmeasured: str | None  # why this pair has no speedup (a run crashed, too few steps)


class Applied(TypedDict, total=False):
    call: str
    values: dict[str, Any]
    was: dict[str, Any]
    skipped: dict[str, Any]


class NotApplied(TypedDict, total=False):
    call: str | None
    key: str
    reason: str


class Trial(TypedDict, total=False):
    """``gpudoctor try`` (the baseline's report; the trial's recording is in ``trial/``): the fix
    tried, what the trial's own ``applied`` events say was set, what was not and why, and
    ``predicted_speedup`` (steady-state steps/s after over before) beside ``achieved_speedup``
    (``trial_steps_per_s / baseline_steps_per_s``) (:mod:`gpudoctor.tryfix.section`). With
    ``--pairs N`` the achieved speedup is the median of the ``pairs``' own ratios and the two
    rates are each side's median: one pair lands wherever the machine's speed was during it."""

    rule: str
    fix: Fix
    values: dict[str, Any]
    unchanged: dict[str, Any]
    set_by_user: Any
    applied: list[Applied]
    not_applied: list[NotApplied]
    complete: bool
    predicted_speedup: Speedup | None
    predicted_speedup_range: SpeedupRange | None
    prediction_basis: str | None
    finding_predicted_speedup: Speedup | None
    achieved_speedup: Speedup | None
    baseline_steps_per_s: Speedup | None
    trial_steps_per_s: Speedup | None
    baseline: Rate | None
    trial: Rate | None
    seconds: Seconds | None
    trial_run: dict[str, Any] | None  # {"folder", "exit_code", "stopped", "status", "window_s", "crash"}
    unmeasured: str | None  # why no achieved speedup: the trial crashed, or the windows were too short
    pairs: list[Pair] | None  # ``--pairs N`` over 1: every pair, the first one included
    notes: list[str]


class NodeEntry(TypedDict, total=False):
    """One node's run folder in a merged job: ``clock_offset_s`` was added to its clock (null: not
    aligned), ``alignment_residual_s`` is the p90 misfit of its step ends after that; data wait
    mean and max over its ranks, checkpoint time its slowest rank's, step times its lead rank's."""

    node: str
    folder: str
    host: str | None
    ranks: list[int]
    status: str
    duration_s: Seconds
    clock_offset_s: Annotated[float, Ge(-MAX_SECONDS), Le(MAX_SECONDS), Says("a time in seconds")] | None
    alignment_residual_s: Seconds | None
    aligned_steps: Count
    breakdown: Breakdown
    data_wait_s: Seconds | None
    data_wait_s_max: Seconds | None
    checkpoint_s: Seconds
    step_time_s: StepTimes
    findings: list[str]


class Nodes(TypedDict):
    """``gpudoctor report NODE0_DIR NODE1_DIR ...``: the job's nodes side by side, and the clock skew
    the merge corrected (:mod:`gpudoctor.report.nodes`): ``reference`` is the node whose clock the
    others were aligned to (null: none could be), ``skew_corrected_s`` the largest offset applied."""

    reference: str | None
    method: str
    skew_corrected_s: Seconds
    nodes: list[NodeEntry]


TrackerKind = Literal["mlflow", "wandb", "tensorboard"]
TrackerStatus = Literal["added", "skipped", "failed"]


class TrackerEntry(TypedDict):
    """One experiment-tracker run the training logged to, and what the doctor added to it
    (:mod:`gpudoctor.trackers`): ``status`` added, skipped (``detail`` says why) or failed."""

    kind: TrackerKind
    status: TrackerStatus
    target: str
    detail: str


# --- the report --------------------------------------------------------------------------------


_CONFIG = {"strict": True, "allow_inf_nan": False, "extra": "allow"}


class Sections(TypedDict, total=False):
    """The optional sections (see :data:`SECTIONS`), alone: what a re-render keeps is checked
    against this before it is kept."""

    # Every TypedDict inside inherits it: no coercion, no NaN/inf, unknown keys allowed.
    if not TYPE_CHECKING:  # type: ignore[misc]  # pydantic reads it; to a type checker it would be a key
        __pydantic_config__ = _CONFIG
    saves: Saves | None
    profiler: list[ProfilerWindow]
    attach: Attach
    prediction_check: PredictionCheck
    preflight: Preflight
    trial: Trial
    nodes: Nodes


class StartupParts(TypedDict, total=False):
    """The startup slice in seconds: the heavy imports (torch, transformers...), model loading
    (``from_pretrained``), dataset loading, dataset ``map``/``filter``, and the rest (a model
    built from a config, the script's own setup). Null when nothing ran inside the training."""

    total_s: Seconds
    imports_s: Seconds
    model_load_s: Seconds
    data_load_s: Seconds
    format_s: Seconds
    other_s: Seconds


class NvmlWindow(TypedDict):
    t_s: Offset
    duration_s: Seconds
    steps: Count
    events_busy: Fraction
    nvml_busy: Fraction
    tolerance: Fraction
    agree: bool


class GpuTimeline(TypedDict, total=False):
    """A CUDA run's GPU clock (CUDA events, never a sync): then ``breakdown``'s data_wait and
    compute are the GPU's idle/busy seconds, and ``host_breakdown`` is the host's view."""

    source: str
    steps_timed: Count
    gpu_step_s: Seconds
    busy_fraction: Fraction
    data_wait_gpu_idle_s: Seconds
    data_wait_host_s: Seconds
    syncs_per_step: Annotated[float, Ge(0.0), Says("a count per step")]
    sync_block_s_per_step: Seconds
    sync_idle_s_per_step: Seconds
    h2d_s_per_step: Seconds
    host_own_s_per_step: Seconds | None  # the host a step not blocked on the GPU: fetch, launches, Python (median)
    host_blocked_s_per_step: Seconds | None  # the host blocked on the GPU in syncs and copies (median)
    host_breakdown: Breakdown
    nvml_windows: list[NvmlWindow]
    nvml_verdict: str | None
    trusted: str


class MfuSection(TypedDict):
    """Model FLOPs utilization: ``value`` null with a ``reason`` when not measured (a CPU run)."""

    value: Fraction | None
    reason: str | None
    inputs: dict[str, Any]


class Report(Sections):
    """``report.json``. The six sections SPEC.md names, plus what renderers need to draw a run from
    report.json alone (``gpudoctor report report.json -o x.html`` needs no raw samples), plus
    the optional :class:`Sections`."""

    if not TYPE_CHECKING:  # type: ignore[misc]  # pydantic reads it; to a type checker it would be a key
        __pydantic_config__ = _CONFIG
    schema: Literal["gpudoctor.report/1"]
    run: Run
    breakdown: Breakdown
    shares: NotRequired[Shares]
    padding: NotRequired[Padding]
    steps: NotRequired[Steps]
    findings: list[Finding]
    cost: Cost
    verdict: str
    per_rank: NotRequired[list[RankEntry]]
    timeline: NotRequired[Timeline]
    notes: NotRequired[list[str]]
    startup: NotRequired[StartupParts | None]
    gpu_timeline: NotRequired[GpuTimeline | None]
    mfu: NotRequired[MfuSection]
    trackers: NotRequired[list[TrackerEntry]]  # gpudoctor.trackers: the tracker runs the figures went to


class Added(Sections, total=False):
    """What a mode adds beside the analysis before the report is written (:func:`gpudoctor.pipeline.finish`):
    its sections, and ``notes`` that replace the analysis' own (replay: where its recording came from)."""

    notes: list[str]


REQUIRED = tuple(sorted(Report.__required_keys__))


@dataclass(frozen=True)
class Section:
    """An optional section: ``kept`` when ``gpudoctor report FOLDER`` re-renders a run folder (a mode
    added it beside the analysis, so the recording cannot rebuild it); the others are rebuilt."""

    key: str
    title: str  # what diff and the notes call it
    written_by: str
    kept: bool


SECTIONS: tuple[Section, ...] = (
    Section("saves", "save counts", "build_report", kept=False),
    Section("profiler", "torch.profiler windows", "build_report", kept=False),
    Section("attach", "attach notes", "gpudoctor attach (build_report)", kept=False),
    Section("prediction_check", "prediction checked on this GPU",
            "gpudoctor replay on a GPU", kept=True),
    Section("preflight", "preflight prediction", "gpudoctor replay --target", kept=True),
    Section("trial", "fix trial", "gpudoctor try", kept=True),
    Section("nodes", "nodes and clock alignment", "gpudoctor report NODE_DIR NODE_DIR ...", kept=False),
)
KEPT_ON_RERENDER = tuple(s.key for s in SECTIONS if s.kept)


def breakdown_items(breakdown: Mapping[str, Any] | None) -> list[tuple[str, float | None]]:
    """The slices in SPEC order (then any extra ones), as ``(name, fraction)``. ``communication``
    only where the report has it: a report from before it was measured had it inside compute."""
    breakdown = breakdown or {}
    keys = [k for k in BREAKDOWN_KEYS if k in breakdown or k not in OPTIONAL_BUCKETS]
    keys += [k for k in breakdown if k not in BREAKDOWN_KEYS]
    return [(k, num(breakdown.get(k))) for k in keys]


# --- gpudoctor diff (gpudoctor.diff/2): not a report section, the figures two reports give ------


class Change(TypedDict):
    """``after - before`` when both are known; null where either is unavailable."""

    before: float | None
    after: float | None
    delta: float | None


class Side(TypedDict):
    """One run as the diff shows it beside the other."""

    command: str
    started_at: str | None
    status: str | None
    gpus: str
    verdict: str
    breakdown: dict[str, float | None]


class Diff(TypedDict):
    """The figures of ``gpudoctor.diff/2`` (:mod:`gpudoctor.report.diff` computes them, its docstring
    says each); the JSON adds ``notes`` and ``summary``, worded from these by
    :mod:`gpudoctor.render.diff_words`."""

    schema: str
    before: Side
    after: Side
    noise: dict[str, Any]
    duration_s: Change
    steps: Change
    step_time_p50_s: dict[str, Any]
    throughput_steps_per_s: dict[str, Any]
    seconds: dict[str, dict[str, Any]]
    breakdown: dict[str, Change]
    wasted_fraction: Change
    wasted_usd_per_hour: Change
    findings: dict[str, list[dict[str, Any]]]
    sections: dict[str, list[str]]
