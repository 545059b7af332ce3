"""Rules for time spent saving checkpoints."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.process import ProcessView
from gpudoctor.analysis.saves import split_saves
from gpudoctor.common.wording import plural
from gpudoctor.core.thresholds import WASTE_SHARE, percent
from gpudoctor.rules import vocabulary
from gpudoctor.rules.account import Claim, claim
from gpudoctor.rules.base import (
    Finding,
    Fix,
    Rule,
    pct,
)
from gpudoctor.rules.names import Names, names_for
from gpudoctor.rules.values import CHECKPOINT_TARGET, save_steps_for


@dataclass
class SaveFigures:
    """What saving cost and what saving less often gives back: figures only, worded by ``_word``."""

    saves: int
    per_save_s: float
    share: float  # of wall time, periodic checkpoints only
    top: str  # the span name that held most of the saving seconds
    current_every: int | float | None  # steps between saves as set (or as observed)
    compute_step_s: float | None  # a step without its saving
    new_every: int | None
    waste: float  # share of wall time saving less often gives back
    slow_s: float  # seconds the steps after saves ran slower (sure, beyond p90)
    slow_up_to_s: float  # the same beyond p50
    final_s: float
    final_saves: int
    side_files: int


class CheckpointOverhead(Rule):
    name = "checkpoint_overhead"
    fires_when = f"saving ≥ {percent(WASTE_SHARE)} of wall"
    fix_from = ('`save_steps` (Lightning: `ModelCheckpoint(every_n_train_steps=…)`) that brings saving under 2% '
                '(measured seconds per save ÷ step time), rounded to 1/2/5×10ⁿ; `save_only_model` '
                '(Lightning: `save_weights_only=True`); also gives back the steps a save slows')

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        names = names_for(p)
        fig = _figures(a, p, names)
        if fig is None:
            return None
        fix = vocabulary.save_fix(names, fig.new_every)
        return _word(fig, fix, _claims(fig, p))


def _figures(a: Analysis, p: ProcessView, names: Names) -> SaveFigures | None:
    kinds = split_saves(p)  # the final save and side files are not "saving too often"
    saves = kinds.checkpoints
    share = tl.total(saves) / p.wall_s
    if share < WASTE_SHARE or not saves:
        return None
    per_save_s = statistics.fmean(b - a_ for a_, b in saves)
    current = vocabulary.current_save_steps(names)
    if not isinstance(current, (int, float)) or current <= 0 or (isinstance(current, float) and current < 1):
        current = round(len(p.step_times) / len(saves)) if p.step_times else None
    # Steady-state step time without saving, so the saving itself does not inflate it.
    compute_step_s = None
    if len(p.step_times) > 2:
        compute_step_s = max(1e-6, (p.seconds("compute") + p.seconds("data_wait")) / len(p.step_times))
    new_every, waste = None, share
    if compute_step_s:
        new_every = save_steps_for(per_save_s, compute_step_s)
        new_share = per_save_s / (per_save_s + new_every * compute_step_s)
        waste = max(0.0, share - new_share * (1 - a.share("startup")))
    slow_s, slow_up_to_s = _after_save_excess_s(p.step_times, saves)
    top = max(p.span_names.get("checkpoint", {}).items(), key=lambda kv: kv[1], default=("save", 0))[0]
    return SaveFigures(len(saves), per_save_s, share, top, current, compute_step_s, new_every, waste,
                       slow_s, slow_up_to_s, tl.total(kinds.final), len(kinds.final), len(kinds.side))


def _claims(fig: SaveFigures, p: ProcessView) -> list[Claim]:
    claims = [claim("checkpoint", fig.waste * p.wall_s, p.seconds("checkpoint"))]
    if fig.slow_up_to_s > 0 and fig.new_every and p.step_times:
        # Fewer saves also spare the steps a save slows down after it (fsync, page cache):
        # seconds beyond a normal step, in compute, removed in proportion to the saves dropped.
        kept = min(1.0, len(p.step_times) / fig.new_every / fig.saves)
        claims.append(claim("compute", (1 - kept) * fig.slow_s, p.seconds("compute"), part="after_save",
                            part_s=fig.slow_up_to_s, up_to_s=(1 - kept) * fig.slow_up_to_s))
    return claims


def _word(fig: SaveFigures, fix: vocabulary.SaveFix, claims: list[Claim]) -> Finding:
    evidence = (
        f"{plural(fig.saves, 'checkpoint save')} ({fig.top}) took {fig.per_save_s:.2f} s each, "
        f"{pct(fig.share)} of wall time"
        + (f", one every {fig.current_every} steps" if fig.current_every else "")
        + (f" of {1000 * fig.compute_step_s:.0f} ms" if fig.compute_step_s else "")
        + (f"; the step after each save ran {fig.slow_up_to_s / fig.saves:.2f} s slower than a normal "
           "one" if fig.slow_up_to_s > 0 else "")
        + (f"; besides them, the final save took {fig.final_s:.2f} s" if fig.final_saves else "")
        + (f" and {plural(fig.side_files, 'side file')} without tensors" if fig.side_files else "")
        + "."
    )
    summary = (f"Save every {fig.new_every} steps to keep saving under {int(CHECKPOINT_TARGET * 100)}% of "
               "wall time" + (f" and {fix.lighter}" if fix.lighter else "") + ".")
    return Finding(
        rule=CheckpointOverhead.name,
        title="Checkpoints are saved too often",
        claims=claims,
        evidence=evidence,
        fix=Fix(summary=summary, config=fix.config, snippet=fix.snippet, library=fix.library, call=fix.call),
        data={"saves": fig.saves, "final_saves": fig.final_saves, "side_files": fig.side_files,
              "per_save_s": round(fig.per_save_s, 3), "current_save_steps": fig.current_every,
              "after_save_excess_s": round(fig.slow_up_to_s, 3)},
    )


def _after_save_excess_s(step_times: list[float], saves: list[tuple[float, float]]) -> tuple[float, float]:
    """Seconds the steps next to each save took beyond a normal step: (beyond p90, beyond p50).

    A save can slow what follows it (the page cache flushing, fsync): that time lands in
    compute, not in the save. The step that holds a save is measured without the save's own
    seconds, and the step after it as it is. Normal steps are those with no save near; the p90
    figure is what the measurement supports for sure, the p50 one what it may be.
    """
    times = sorted(step_times)
    if len(times) < 10 or not saves:
        return 0.0, 0.0
    intervals = list(zip(times, times[1:], strict=False))
    inside: dict[int, float] = {}  # interval index -> save seconds inside it
    for a, b in saves:
        for i in range(max(0, bisect.bisect_right(times, a) - 1), min(len(intervals), bisect.bisect_left(times, b))):
            t0, t1 = intervals[i]
            inside[i] = inside.get(i, 0.0) + max(0.0, min(b, t1) - max(a, t0))
    near = {i: intervals[i][1] - intervals[i][0] - s for i, s in inside.items()}
    for i in inside:
        if i + 1 < len(intervals) and i + 1 not in near:
            near[i + 1] = intervals[i + 1][1] - intervals[i + 1][0]
    normal = [t1 - t0 for i, (t0, t1) in enumerate(intervals) if i not in near]
    if len(normal) < 5 or not near:
        return 0.0, 0.0
    p50, p90 = statistics.median(normal), statistics.quantiles(normal, n=10)[8]
    sure = sum(max(0.0, d - p90) for d in near.values())
    maybe = sum(max(0.0, d - p50) for d in near.values())
    if sure <= 0:
        return 0.0, 0.0  # within a normal step's spread: nothing to claim
    return sure, maybe
