"""Rules that look at the batches themselves: padding."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpudoctor.analysis import Analysis, gpu_timeline, workload
from gpudoctor.analysis.memory import step_memory
from gpudoctor.analysis.process import ProcessView, dynamic_padding_tokens
from gpudoctor.common import batchlengths
from gpudoctor.common.wording import plural
from gpudoctor.core import schema
from gpudoctor.core.thresholds import WASTE_SHARE, percent
from gpudoctor.recording.length_cost import LengthCost
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule, Table, pct
from gpudoctor.rules.memory import fix_memory
from gpudoctor.rules.names import Names, names_for
from gpudoctor.rules.values import PAD_MULTIPLES, batch_multiple, max_length_for, pad_multiple_for

MIN_PAD_FRACTION = 0.10  # pad tokens of all tokens: below this, padding is not worth a finding
MIN_RECOVERABLE = WASTE_SHARE
ALREADY_PER_BATCH = 0.02  # per-batch padding would save under 2% of the tokens: it is what runs


@dataclass(frozen=True)
class PadFigures:
    """How much of each batch is padding and what padding less gives back: worded by ``_word``."""

    pad_fraction: float
    batches_seen: int
    p50_length: int | None
    p99_length: int | None
    longest_seen: int | None  # the width rows are padded to now
    multiple: int  # the pad multiple fitted to the rows: what the cap is rounded up to
    tokens_now: int
    tokens_dynamic: int  # each batch padded to its longest row
    new_max: int | None  # max_length: p99 rounded up to the multiple; None when it shortens nothing
    gain: PaddingGain
    packing: bool  # lengths vary inside batches too: packing beats padding per batch
    waste: float  # share of compute the fix removes
    rows_seen: int = 0  # rows whose real length the batches recorded (a sample of the training's)
    rows_cut: int = 0  # of those, rows longer than new_max: what the cap truncates
    longest_row: int | None = None  # the longest real row seen
    per_batch_now: bool = False  # each batch is already padded to its longest row
    whole_table: bool = False  # rows_seen is every row of the dataset (its Arrow column), not a sample
    memory: schema.FixMemory | None = None  # the widest batch's peak after the cap, and the headroom left
    batch_multiple: int = 1  # each batch padded to its longest row rounded up to this (1: exactly)

    @property
    def recoverable(self) -> float:
        return 1.0 - self.tokens_dynamic / self.tokens_now if self.tokens_now else 0.0


class PaddingWaste(Rule):
    name = "padding_waste"
    fires_when = (f'pad tokens ≥ {percent(MIN_PAD_FRACTION)} and per-batch padding (where it runs already: rows '
                  f'sorted into batches by length) would save ≥ {percent(MIN_RECOVERABLE)} of the compute')
    fix_from = '`max_length` = observed p99 rounded up to the pad multiple (64/32/16/8, fitted to the rows), never above what is padded now; per-batch padding (to a tensor-core multiple on CUDA, to the longest row exactly on a CPU; the rows after drawn from every row seen when under 32 batches were seen) / `group_by_length` (names checked against the recorded TrainingArguments; only when the dataset items carry `input_ids` or the length column); packing; gain from the workload model: per-token and per-token² costs fitted to the steps where batch widths vary, else the model (or a GPT-2 of its recorded shape) timed after the run at several widths on the same device, else PaLM FLOPs of the recorded shape; between linear token work and quadratic attention when the shape is unknown'

    def match(self, a: Analysis) -> Finding | None:
        names = names_for(a.primary)
        fig = _figures(a, names)
        if fig is None:
            return None
        # the widest batch after the cap: its rows as wide as new_max at most (per-batch padding
        # leaves the widest batch as it is)
        width = min(fig.new_max, fig.longest_seen) if fig.new_max and fig.longest_seen else fig.longest_seen
        scale = width / fig.longest_seen if width and fig.longest_seen else 1.0
        fig = replace(fig, memory=fix_memory(a, step_memory(a), scale, per="tokens"))
        # Fewer tokens computed: a share of all compute, compounding with faster math. The
        # workload model sizes it (one value); without the model's shape, between linear token
        # work and quadratic attention (packing's ``waste`` is the pad share, also linear).
        gain = fig.gain
        fewer = Claim("compute", fig.waste, up_to=gain.up_to if not fig.packing and gain.up_to else None)
        return _word(fig, names, fewer)


def _figures(a: Analysis, names: Names) -> PadFigures | None:
    batches = [b for p in a.procs for b in p.batches]
    pad = a.padding()
    frac = pad["pad_fraction"]
    if not batches or frac is None or frac < MIN_PAD_FRACTION:
        return None
    multiple = pad_multiple_for(pad["p50_length"])
    per_batch = batch_multiple(a, multiple)
    now, after = dynamic_padding_tokens(batches, per_batch)
    recoverable = 1.0 - after / now if now else 0.0
    p99, longest_seen = pad["p99_length"], pad["max_length"]
    table = _table_lengths(a)  # every row of a ``datasets`` table, where the hooks could read its column
    if table is not None:
        p99 = _table_quantile(table, 0.99)
    new_max = max_length_for(p99, longest_seen, multiple=multiple)
    gain = predict_padding(a, new_max, per_batch, per_batch=names.is_trainer)
    packing = frac >= 0.5 and recoverable < 0.5 * frac  # lengths vary inside batches too
    # Each batch already padded to its longest row: "pad per batch" is what runs (#40 item 9); what
    # is left is rows of unlike lengths in one batch, which sorting them into batches by length removes.
    # A loop that pads each batch to a multiple of its own (8, 64) pads per batch as much as one
    # that pads exactly: judged at the multiple fitted to the rows, whatever the fix pads to.
    padded_to = after if per_batch == multiple else dynamic_padding_tokens(batches, multiple)[1]
    per_batch_now = (1.0 - padded_to / now if now else 0.0) < ALREADY_PER_BATCH and len(
        {int(b["seq_len"]) for b in batches}) > 1
    bucketed = predict_bucketing(a, _own_multiple(batches)) if per_batch_now and gain.saving < MIN_RECOVERABLE else None
    if bucketed is not None:
        gain = bucketed
    waste = gain.saving  # one knob, one prediction: the configured fix's gain, never packing's beside it
    if waste < MIN_RECOVERABLE:
        return None
    lengths = [int(x) for b in batches for x in b.get("lengths") or []]
    cut = sum(1 for x in lengths if new_max is not None and x > new_max and bucketed is None)
    rows, longest = len(lengths), max(lengths) if lengths else None
    if table is not None:  # what the cap cuts, counted over every row of the dataset
        edges, counts = table
        rows, longest = sum(counts), max(edges)
        cut = sum(c for e, c in zip(edges, counts, strict=True) if new_max is not None and e > new_max
                  and bucketed is None)
    return PadFigures(frac, pad["batches_seen"], pad["p50_length"], p99, longest_seen, multiple, now, after,
                      None if bucketed is not None else new_max, gain, packing, waste, rows, cut, longest,
                      per_batch_now=per_batch_now, whole_table=table is not None, batch_multiple=per_batch)


def _own_multiple(batches: list[Any]) -> int:
    """The multiple a loop that pads per batch already rounds its widths up to (1: exactly): its
    batches sorted by length are padded its way."""
    tops = [(batchlengths.longest(b), int(b["seq_len"])) for b in batches]
    known = [(top, width) for top, width in tops if top is not None]
    for m in (*PAD_MULTIPLES, 1):
        if known and all(width == batchlengths.padded_width(top, m) for top, width in known):
            return m
    return 1


def _cap_words(fig: PadFigures) -> str:
    """What the cap cuts, from the rows seen (or every row of a ``datasets`` table): a max_length
    below the longest row truncates rows."""
    if fig.new_max is None or not fig.rows_seen:
        return ""
    rows = f"all {fig.rows_seen} rows of the dataset" if fig.whole_table else f"the {fig.rows_seen} rows seen"
    longest = f"at most {fig.longest_row}" if fig.whole_table else f"{fig.longest_row}"  # 8-token buckets
    if not fig.rows_cut:
        return f": it truncates none of {rows}, the longest {longest} tokens"
    return (f": it truncates {pct(fig.rows_cut / fig.rows_seen)} of {rows} "
            f"({fig.rows_cut}, the longest {longest} tokens, cut to {fig.new_max}); keep "
            f"max_length at {fig.longest_row} or more to truncate none")


def _table_lengths(a: Analysis) -> tuple[list[int], list[int]] | None:
    """The primary loader's dataset row lengths (8-token buckets), when they vary (a column padded to
    one width says nothing of the real rows)."""
    p = a.primary
    for loader in p.loaders if p is not None else []:
        edges, counts = loader.get("length_edges"), loader.get("length_counts")
        if edges and counts and len(edges) == len(counts) > 1:
            return list(edges), list(counts)
    return None


def _table_quantile(table: tuple[list[int], list[int]], q: float) -> int:
    """The bucket edge at which ``q`` of the rows are covered (at most 7 tokens above the true one)."""
    edges, counts = table
    total, seen = sum(counts), 0
    for edge, count in sorted(zip(edges, counts, strict=True)):
        seen += count
        if seen >= q * total:
            return edge
    return max(edges)


def _word(fig: PadFigures, names: Names, fewer: Claim) -> Finding:
    new_max, multiple, gain = fig.new_max, fig.batch_multiple, fig.gain
    rounded: dict[str, object] = {"pad_to_multiple_of": multiple} if multiple > 1 else {}
    truncate: dict[str, object] = {"truncation": True, "max_length": new_max} if new_max else {}
    if names.is_trainer:
        # Sorting by length needs items the sampler can size: applied without, the run crashes.
        args: dict[str, object] = _group_by_length(names) if names.items_carry_lengths() else {}
        tables = [Table(names.library, names.call, args),
                  Table("transformers tokenizer", "tokenizer", truncate),
                  Table("transformers DataCollatorWithPadding", "DataCollatorWithPadding", rounded)]
        snippet = (
            "tokenized = ds.map(lambda b: tokenizer(b['text'], truncation=True"
            + (f", max_length={new_max}" if new_max else "")
            + "), batched=True)  # no padding here\n"
            "collator = DataCollatorWithPadding(tokenizer"
            + (f", pad_to_multiple_of={multiple}" if rounded else "") + ")\n"
            "trainer = Trainer(..., data_collator=collator)"
        )
    else:
        tables = [Table("transformers tokenizer", "tokenizer",
                        {"padding": "longest", **truncate, **rounded})]
        snippet = (
            "batch = tokenizer(texts, padding='longest', truncation=True"
            + (f", max_length={new_max}" if new_max else "")
            + (f", pad_to_multiple_of={multiple}" if rounded else "") + ", return_tensors='pt')"
        )
    if gain.rows_after == "bucketed" and not names.is_trainer:
        tables = []  # a sampler is the loop's own code: no call's arguments say it
        snippet = (
            "# batches of similar length: indices sorted by length in shuffled chunks of 50 batches\n"
            "order = sorted(range(len(ds)), key=lambda i: lengths[i])\n"
            "chunks = [order[i:i + 50 * batch_size] for i in range(0, len(order), 50 * batch_size)]\n"
            "batches = [c[i:i + batch_size] for c in chunks for i in range(0, len(c), batch_size)]\n"
            "random.shuffle(batches)\n"
            "loader = DataLoader(ds, batch_sampler=batches, collate_fn=collate)  # each padded to its longest"
        )
    if fig.packing:
        snippet += "\n# or pack several examples into each row (no padding at all):\n# see trl's packing=True / DataCollatorWithFlattening"
    return Finding(
        rule=PaddingWaste.name,
        title="Most of each batch is padding",
        claims=[fewer],
        evidence=(
            f"{pct(fig.pad_fraction)} of the tokens in {fig.batches_seen} training batches are padding: rows are "
            f"padded to {fig.longest_seen} while the real lengths have p50 {fig.p50_length} and p99 {fig.p99_length}. "
            "Padding each batch to its longest row"
            + (f" (multiple of {multiple})" if multiple > 1 else "") + f" would drop {pct(fig.recoverable)} "
            "of the tokens computed. " + _gain_words(gain)
        ),
        fix=Fix(
            summary=_fix_words(fig),
            snippet=snippet,
            memory=fig.memory,
            **Table.main_and_also(tables),
        ),
        data={
            "pad_fraction": round(fig.pad_fraction, 4),
            "tokens_now": fig.tokens_now,
            "tokens_dynamic": fig.tokens_dynamic,
            "p99_length": fig.p99_length,
            "max_length": fig.longest_seen,
            "new_max_length": new_max,
            "rows_seen": fig.rows_seen,
            "rows_truncated": fig.rows_cut,
            "longest_row": fig.longest_row,
            "rows_counted_from": "dataset" if fig.whole_table else "batches",
            "compute_after_ratio": round(1 - gain.saving, 4),
            "compute_after_ratio_range": [round(1 - gain.up_to, 4), round(1 - gain.saving, 4)]
            if gain.up_to else None,
            "workload_basis": gain.basis,
            "rows_after": gain.rows_after,
            "packing_compute_after_ratio": round(gain.packing_ratio, 4) if gain.packing_ratio else None,
        },
    )


def _fix_words(fig: PadFigures) -> str:
    """What to change: never "pad per batch" where each batch is padded to its longest row already."""
    if fig.gain.rows_after == "bucketed":
        return ("Rows are already padded per batch, yet the lengths vary inside each batch: sort rows into "
                "batches of similar length (group_by_length, or a sampler that batches indices sorted by "
                "length in shuffled chunks)" + (", or pack examples" if fig.packing else "") + ".")
    cap = (f"cap max_length at {fig.new_max} (p99 rounded up to {fig.multiple}){_cap_words(fig)}"
           if fig.new_max else "")
    if fig.per_batch_now:
        return f"Rows are already padded per batch; {cap}." if cap else "Rows are already padded per batch."
    return (f"Pad per batch instead of to {fig.longest_seen}" + (f", and {cap}" if cap else "")
            + (", or pack examples" if fig.packing else "") + ".")


def predict_bucketing(a: Analysis, multiple: int) -> PaddingGain | None:
    """What sorting rows into batches of similar length saves: the recorded rows' lengths sorted,
    cut into batches of the recorded size, each padded to its longest (rounded up to ``multiple``,
    at most the width that ran); the cost from the same workload model as every padding fix."""
    p = a.primary
    batches = [b for q in a.procs for b in q.batches if b.get("lengths")]
    if p is None or not batches:
        return None
    before = [(len(b.get("lengths") or []), int(b["seq_len"])) for b in batches]
    rows = max(1, round(sum(r for r, _ in before) / len(before)))
    cap = max(w for _, w in before)
    ordered = sorted(int(x) for b in batches for x in b.get("lengths") or [])
    after = [(len(chunk), min(cap, batchlengths.padded_width(max(chunk), multiple)))
             for chunk in (ordered[i:i + rows] for i in range(0, len(ordered), rows))]
    shape = workload.shape_from_model_event(p.model)
    fit = workload.fit(shape, _steps(p))
    per_step = _per_step_share(p)
    ratio = workload.cost_ratio(fit, before, after) if fit else None
    if ratio is None or fit is None:
        tok, sq = workload.linear_and_quadratic(before, after)
        return PaddingGain(max(0.0, 1 - tok), max(0.0, 1 - sq), "tokens", "bucketed", None,
                           token_ratio=tok, attention_ratio=sq)
    return PaddingGain(max(0.0, (1 - ratio) * (1 - per_step)), None, fit.basis, "bucketed", None, None, ratio,
                       shape, per_step=per_step)


def _group_by_length(names: Names) -> dict[str, object]:
    if names.has("train_sampling_strategy"):
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True} if names.has("group_by_length") else {}


@dataclass(frozen=True)
class PaddingGain:
    """Share of the compute a padding fix removes, from the one workload model (worded by ``_gain_words``)."""

    saving: float  # 1 - cost after / cost now (the conservative figure when a range)
    up_to: float | None  # quadratic bound, only when the model's shape is unknown
    basis: str  # "fitted" | "measured" | "flops" | "tokens"
    rows_after: str  # "max_length" (every row padded to it) | "per_batch" (each batch to its longest) | "bucketed"
    packing_ratio: float | None  # compute after packing the rows into max_length rows, over today's
    widths: tuple[int, int] | None = None  # (width now, after) when rows_after is "max_length"
    ratio: float | None = None  # the workload model's compute after over today's
    shape: workload.Shape | None = None  # the recorded model shape whose FLOPs sized it
    token_ratio: float = 1.0  # without a model: tokens after over now (linear work)
    attention_ratio: float = 1.0  # and tokens² after over now (quadratic attention)
    per_step: float = 0.0  # share of the compute in optimizer.step: work per step, left as it is
    measured: LengthCost | None = None  # the model timed at several widths, when that sized it
    launch: GpuBound | None = None  # on a GPU: the host's launches beside the kernels, when that sized it


@dataclass(frozen=True)
class GpuBound:
    """A CUDA step's two floors, per step: the host's own seconds (fetching the batch, launching the
    step's kernels and the Python around them: all but its time blocked on the GPU, measured beside
    the GPU clock) and the GPU's busy seconds now."""

    host_s: float
    kernels_s: float


def gpu_cost_ratio(a: Analysis, measured: LengthCost | None, before: list[tuple[int, int]],
                   after: list[tuple[int, int]]) -> tuple[float, GpuBound] | None:
    """Compute after over today's on a GPU (``before`` and ``after``: one step's batch each), where
    a step takes about the longer of its launches and its kernels, not their sum: the host queues
    kernels while the GPU runs those before, so whichever is slower sets the pace. The kernels scale with width as the stand-in's kernels
    timed alone do (queued ahead of the GPU: :func:`gpudoctor.launch.length_cost_worker._kernels_alone`),
    from the GPU's busy seconds now; the launches are the training's own, and a padding fix leaves
    them as they are. On an H200 a narrow model (4 layers of 256) padded to 1024 stepped in 19.8 ms,
    its kernels; padded to 224 its host's own 8.7 ms a step set the pace (its kernels there: 4.8 ms).
    Summing the stand-in's passes (GPT-2's own launches beneath the training's fixed cost) read the
    fix as 1.74x where it gave 2.48x (1.41x for 2.36x in another call); read as the longer of the
    two, 2.26x (tests/data/h200_narrow_padding). None where either floor is not measured (a CPU
    run, no kernel timings, a host that never blocked where seen)."""
    fig = gpu_timeline.figures(a)
    if fig is None or measured is None or measured.device != "cuda" or not measured.kernels:
        return None
    host = fig.host_bound
    kernels = workload.fit_measured([(q.rows, q.width, float(q.kernel_s or 0.0)) for q in measured.points])
    if host is None or kernels is None or not before or not after or fig.gpu_step_s <= 0:
        return None
    busy = fig.gpu_step_s * fig.busy_fraction
    mean_now = statistics.fmean(kernels.batch_s(r, w) for r, w in before)
    if mean_now <= 0:
        return None

    def cost(batches: list[tuple[int, int]]) -> float:
        """The compute of steps made of these batches, one each: the longer of the two floors."""
        return sum(max(host, busy * kernels.batch_s(r, w) / mean_now) for r, w in batches)

    now = cost(before)
    return (cost(after) / now, GpuBound(host, busy)) if now > 0 else None


def predict_padding(a: Analysis, new_max: int | None, multiple: int, *, per_batch: bool) -> PaddingGain:
    """What capping ``max_length`` at ``new_max`` (and padding per batch) saves of the compute.

    Rows after the fix: a run whose rows all had one width and that tokenized before training
    pads its whole dataset in one call, so its rows become ``new_max`` wide; otherwise (a
    tokenizer or collator per batch, or ``per_batch``) each batch is padded to its longest row,
    rounded up to ``multiple``, at most ``new_max``. The cost of a batch is the workload model's
    (:mod:`gpudoctor.analysis.workload`): fitted to the run's steps when it shows several widths,
    else the recorded model shape's FLOPs. Without either, a range: linear tokens to quadratic.
    """
    p = a.primary
    batches = [b for q in a.procs for b in q.batches]
    before = [_rows(b) for b in batches]
    fixed = len({w for _, w in before}) == 1 and not any(q.tokenize_in_loop_s > 0 for q in a.procs)
    drawn = None
    if fixed and not per_batch and new_max:
        after = [(r, min(w, new_max)) for r, w in before]
        rows_after = "max_length"
    else:
        after = [(r, min(w, _longest(b, multiple), new_max or w)) for (r, w), b in zip(before, batches, strict=True)]
        rows_after = "per_batch"
        drawn = _drawn_batches(batches, multiple, new_max)
    shape = workload.shape_from_model_event(p.model if p else None)
    fit = workload.fit(shape, _steps(p) if p else [])
    measured = a.rec.length_cost
    if measured is not None and (fit is None or fit.basis != "fitted"):
        points = [(q.rows, q.width, q.seconds) for q in measured.points]
        if p is not None and not measured.stand_in:
            points = _ran_as_seen(points, before, p, measured.draws)
        timed = workload.fit_measured(points)
        if timed is not None and measured.stand_in and p is not None:
            timed = _own_fixed_cost(timed, measured, p)
        fit = timed or fit
    # drawn: the same batches, widths from every row seen; the widths before repeat to match
    compared = (before * (len(drawn) // len(before)), drawn) if drawn else (before, after)
    ratio = workload.cost_ratio(fit, *compared) if fit else None
    on_gpu = gpu_cost_ratio(a, measured, *compared)
    lengths = [int(x) for b in batches for x in b.get("lengths") or []]
    packed = workload.packed_rows(lengths, new_max or max(w for _, w in before)) if lengths else []
    packing = workload.cost_ratio(fit, before, packed) if fit and packed else None
    widths = (before[0][1], after[0][1]) if rows_after == "max_length" and before else None
    per_step = _per_step_share(p)
    if on_gpu is not None:  # the whole step, the optimizer's launches and kernels in it
        gpu_ratio, bound = on_gpu
        # packed rows go through the loop as batches of today's rows: fewer steps, each as wide as the cap
        per = max(1, round(statistics.fmean(r for r, _ in before)))
        packed_gpu = gpu_cost_ratio(a, measured, before, [(per, w) for r, w in packed
                                                          for _ in range(math.ceil(r / per))]) if packed else None
        return PaddingGain(max(0.0, 1 - gpu_ratio), None, "measured", rows_after,
                           packed_gpu[0] if packed_gpu else None, widths, gpu_ratio, shape,
                           measured=measured, launch=bound)
    if ratio is not None and fit is not None:
        return PaddingGain(max(0.0, (1 - ratio) * (1 - per_step)), None, fit.basis, rows_after,
                           per_step + (1 - per_step) * packing if packing is not None else None,
                           widths, ratio, shape, per_step=per_step,
                           measured=measured if fit.basis == "measured" else None)
    tok, sq = workload.linear_and_quadratic(*compared)
    return PaddingGain(max(0.0, 1 - tok), max(0.0, 1 - sq), "tokens", rows_after, None, widths,
                       token_ratio=tok, attention_ratio=sq)


def _gain_words(g: PaddingGain) -> str:
    """The workload model's prediction in a sentence: how it was sized, and the compute after."""
    widths = (f"{g.widths[0]} → {g.widths[1]}" if g.widths
              else "sorted into batches by length" if g.rows_after == "bucketed" else "per batch")
    if g.ratio is not None:
        shape = g.shape
        flops = (f"the FLOPs of {shape.source if shape else 'the model'} (N={_si(shape.params if shape else 0)}, "
                 f"{shape.n_layers if shape else '?'} layers, hidden {shape.hidden if shape else '?'}; "
                 "PaLM 6N + attention)")
        how = ("per-token and per-token² costs fitted to the steps' measured times over their row widths"
               if g.basis == "fitted" else _measured_words(g.measured) if g.basis == "measured" else flops)
        if g.launch is not None:
            how = (f"on the GPU a step takes about the longer of the host's launches ({_ms(g.launch.host_s)} a "
                   f"step here, its own work beside the GPU clock) and its kernels ({_ms(g.launch.kernels_s)} "
                   f"busy now), the kernels scaled as {_kernels_words(g.measured)}")
        kept = (f"; the optimizer's {pct(g.per_step)} of the compute does not shrink with the rows"
                if g.per_step >= 0.005 else "")
        return (f"Rows {widths}: the workload model ({how}) puts the batches' compute after at "
                f"{g.ratio:.3f}× today's{kept}.")
    return (f"Rows {widths}: no model shape was recorded, so the saving lies between the tokens' "
            f"({1 - g.token_ratio:.0%}) and the attention's ({1 - g.attention_ratio:.0%}).")


def _ran_as_seen(points: list[tuple[int, int, float]], before: list[tuple[int, int]],
                 p: ProcessView, draws: int = 1) -> list[tuple[int, int, float]]:
    """The timed passes on the training's own scale where the child ran slower than the training.

    The timing child starts just after the training exits, and a pass can meet what the exit
    leaves (a try baseline's pass at 512 wide timed 645 ms where the training's batches took 264 ms
    and the same child, run again on a quiet machine, 216-228 ms). Work is only ever added to a
    pass, so at the width that ran the smaller of the two is the truer figure. What follows from it
    depends on what outvoted the disturbance. With one draw, nothing did: that pass alone is
    brought down to the training's batch. With several draws (forked processes, each read relative
    to its own pass at the width that ran: :func:`gpudoctor.launch.draws.median_ratios`) a draw that
    met a disturbance is outvoted already, and a child still slower than the training is slower as
    a whole (its process's heap and the machine's state over its life, or a loss the training does
    not compute): every width is scaled alike, so the curve keeps the child's own shape. Lowering
    the one pass there read every narrower width on the child's slower scale against the
    training's faster one: loop 10 of the proving ground (a child 1.31x the training at 512 wide)
    put the compute after at 0.165 of today's where the child's own passes said 0.126 and the fixed
    loop stepped in 0.76 of the child's time at the fix's widths."""
    own = _own_batch_s(p)
    if own is None or own <= 0 or len(set(before)) != 1:
        return points
    rows, width = before[0]
    ran = next((s for r, w, s in points if (r, w) == (rows, width)), None)
    if ran is None or ran <= own:
        return points
    if draws > 1:
        return [(r, w, s * own / ran) for r, w, s in points]
    return [(r, w, own if (r, w) == (rows, width) else s) for r, w, s in points]


def _own_batch_s(p: ProcessView) -> float | None:
    """The training's own compute per batch, less the optimizer's share (work per step, not per
    row); None when no batch was seen."""
    if not p.batches:
        return None
    return p.seconds("compute") / len(p.batches) * (1.0 - _per_step_share(p))


def _own_fixed_cost(timed: workload.Fit, m: LengthCost, p: ProcessView) -> workload.Fit:
    """A stand-in's width-dependent cost, with the training's own fixed cost per batch: a GPT-2 of
    the recorded shape does the same FLOPs at each width, but its kernel launches and Python are
    GPT-2's (on an H200 its narrow passes were launch-bound at 9.5 ms). The training's own batch
    at the width that ran, less the stand-in's width-dependent part there, is its fixed part."""
    widest = max(m.points, key=lambda q: q.width)
    own = _own_batch_s(p)
    if own is None:
        return timed
    width_part = timed.batch_s(widest.rows, widest.width) - timed.per_batch_s
    return replace(timed, per_batch_s=max(0.0, own - width_part))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _kernels_words(m: LengthCost | None) -> str:
    if m is None:
        return "the model's kernels timed at several widths"
    widths = ", ".join(str(q.width) for q in sorted(m.points, key=lambda q: q.width))
    model = f"a GPT-2 of the recorded shape (standing in for {m.model})" if m.stand_in else m.model
    return f"the kernels of {model}, timed alone on this GPU after the run (queued ahead of it), at widths {widths}"


def _measured_words(m: LengthCost | None) -> str:
    if m is None:
        return "the model timed at several widths"
    widths = ", ".join(str(q.width) for q in sorted(m.points, key=lambda q: q.width))
    where = (m.device + (f", {plural(m.threads, 'thread')}" if m.threads else "") + (f", {m.dtype}" if m.dtype else "")
             + (f"; the median of {m.draws} processes" if m.draws > 1 else ""))
    if m.stand_in:
        return (f"a GPT-2 of the recorded shape (standing in for {m.model}) timed here after the run, random "
                f"weights, forward and backward at widths {widths} ({where}): its cost per token and per token², "
                f"with {m.model}'s own fixed cost per batch from the training's steps")
    return (f"{m.model} timed here after the run, random weights, forward and backward at widths {widths} "
            f"({where}), fitted with its fixed cost per batch")


def _per_step_share(p: ProcessView | None) -> float:
    """Share of the compute spent in ``optimizer.step``: work per step, not per token, so a
    padding fix leaves it as it is (on a narrow model it is a tenth of a short step)."""
    if p is None or p.optimizer_s <= 0:
        return 0.0
    compute = p.seconds("compute")
    return min(1.0, p.optimizer_s / compute) if compute > 0 else 0.0


FEW_BATCHES = 32  # under this many batches seen, their longest rows are drawn again from all rows seen
DRAWS = 512  # batches drawn, at least


def _drawn_batches(batches: list[Any], multiple: int, new_max: int | None) -> list[tuple[int, int]] | None:
    """Batches after per-batch padding, drawn from every row seen when few batches were seen.

    A padded batch costs what its longest row does, and the longest of n rows is a noisy figure:
    three batches of 16 rows seen put the mean longest row at 521 where the run's was 580, and
    drawn again from those 48 rows alone at 504 (no draw exceeds the longest row seen). So rows
    are drawn from a smoothed bootstrap: a row seen, times a log-normal jitter whose width is
    Silverman's rule for the log lengths (it shrinks as more rows are seen), shrunk back towards the
    rows' mean so the draws keep the rows' own spread (Silverman's rescaled smoothed bootstrap: the
    jitter alone widens the rows, and the longest of n rows grows with their spread: 2.5-10% too
    long in simulated recordings of 3-24 batches), in batches of the recorded sizes, capped as the
    fix caps them. Only where rows went into batches at random: each batch's spread of log lengths
    at least half the spread of all rows (a loader that sorts by length fails it). A fixed seed: one
    recording, one figure. The result is a whole multiple of the batches seen, so the widths before repeat to match; None when enough batches were seen,
    or when the widths vary now (each batch's own longest row is then what it is compared with).
    """
    if len(batches) >= FEW_BATCHES or len({int(b["seq_len"]) for b in batches}) > 1:
        return None  # enough batches, or widths that vary now: the same batches compare before and after
    sizes = [batchlengths.rows(b) for b in batches]
    logs = [[math.log(max(1, int(x))) for x in b.get("lengths") or []] for b in batches]
    if any(len(ls) != n or n < 2 for ls, n in zip(logs, sizes, strict=True)):
        return None  # a sampled batch (over 1,024 rows) or one row a batch: nothing to draw
    pooled = [x for ls in logs for x in ls]
    spread = statistics.pvariance(pooled)
    if spread <= 0 or statistics.fmean(statistics.pvariance(ls) for ls in logs) < 0.5 * spread:
        return None
    jitter = 1.06 * math.sqrt(spread) * len(pooled) ** -0.2  # Silverman's bandwidth
    centre, shrink = statistics.fmean(pooled), 1.0 / math.sqrt(1.0 + jitter * jitter / spread)
    rng = random.Random(0)
    out = []
    for _ in range(-(-DRAWS // len(batches))):
        for b, n in zip(batches, sizes, strict=True):
            top = math.ceil(math.exp(max(centre + (rng.choice(pooled) - centre + rng.gauss(0.0, jitter)) * shrink
                                         for _ in range(n))))
            width = int(b["seq_len"])
            out.append((n, min(width, batchlengths.padded_width(top, multiple), new_max or width)))
    return out


def _rows(b: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, padded width) of a batch: rows exact even when ``lengths`` is a sample."""
    seq = int(b["seq_len"])
    return batchlengths.rows(b) or max(1, int(b["tokens"]) // max(1, seq)), seq


def _longest(b: Mapping[str, Any], multiple: int) -> int:
    top = batchlengths.longest(b)  # exact, even when lengths is a sample
    return batchlengths.padded_width(top, multiple) if top is not None else int(b["seq_len"])


def _steps(p: ProcessView) -> list[tuple[list[tuple[int, int]], float]]:
    """Each step's batches and its seconds: the batches seen between two step marks."""
    times = sorted(p.step_times)
    batches = sorted(p.batches, key=lambda b: float(b.get("t") or 0.0))
    out: list[tuple[list[tuple[int, int]], float]] = []
    j = 0
    for t0, t1 in zip(times, times[1:], strict=False):
        mine = []
        while j < len(batches) and float(batches[j].get("t") or 0.0) <= t1:
            if float(batches[j].get("t") or 0.0) > t0:
                mine.append(_rows(batches[j]))
            j += 1
        if mine:
            out.append((mine, t1 - t0))
    return out


def _si(x: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"
