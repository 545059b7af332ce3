"""Evaluation that takes a large share of the run: in a Trainer or in a hand-written loop.

A hand-written loop has no ``eval_steps`` to read, so the fix is sized from what was
measured: how many evals ran, how many steps apart, how many batches each, and how
long a step takes. It names the loop's eval interval and eval batches generically
(``eval_interval``, ``eval_batches``); a script's own flag names are mapped elsewhere.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.process import ProcessView, eval_spans
from gpudoctor.common.wording import plural
from gpudoctor.core.events import EVAL_FORWARDS as FORWARDS
from gpudoctor.core.thresholds import EVAL_SHARE, percent
from gpudoctor.rules import vocabulary
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import LOOP_LIBRARY, Finding, Fix, Rule, pct
from gpudoctor.rules.names import Names, names_for
from gpudoctor.rules.values import nice_round_up

TARGET = 0.05  # evaluating at most this share of wall time


@dataclass
class EvalCadence:
    """What the evals of one process looked like."""

    evals: int
    per_eval_s: float
    interval_steps: int | None  # median training steps between two evals
    batches: int | None  # forward passes per eval (hand-written loops, from the hooks)
    step_s: float | None  # a training step without eval


def cadence(p: ProcessView) -> EvalCadence:
    evals = tl.merge(eval_spans(p))
    times = sorted(p.step_times)
    gaps = [bisect.bisect_left(times, b[0]) - bisect.bisect_right(times, a[1])
            for a, b in zip(evals, evals[1:], strict=False)]
    gaps = [g for g in gaps if g > 0]
    forwards = sum(c.calls for c in p.records.counters if c.name == FORWARDS)
    steps = len(times)
    loop_s = p.seconds("compute") + p.seconds("data_wait") + p.seconds("checkpoint")
    return EvalCadence(
        evals=len(evals),
        per_eval_s=statistics.fmean(b - a for a, b in evals) if evals else 0.0,
        interval_steps=round(statistics.median(gaps)) if gaps else None,
        batches=round(forwards / len(evals)) if forwards and evals else None,
        step_s=loop_s / steps if steps and loop_s > 0 else None,
    )


@dataclass(frozen=True)
class EvalFigures:
    """What evaluating cost and what evaluating less gives back: figures only, worded by ``_word``."""

    eval_s: float
    wall_s: float
    cadence: EvalCadence
    waste: float  # share of wall time the fix gives back
    eval_steps: int | None = None  # a Trainer: eval_steps scaled to TARGET
    eval_batch_size: int | None = None  # a Trainer: twice its eval batch
    new_interval: int | None = None  # a hand-written loop: steps between evals, a multiple of today's
    new_batches: int | None = None  # or batches per eval at today's interval, when fewer

    @property
    def share(self) -> float:
        return self.eval_s / self.wall_s


class EvalOverhead(Rule):
    name = "eval_overhead"
    fires_when = (f"evaluation ≥ {percent(EVAL_SHARE)} of wall (Trainer, Lightning, or a hand-written loop's forwards "
                  "without backward)")
    fix_from = "Trainer: `eval_steps` scaled to 5%, a larger eval batch; a hand-written loop: a longer eval interval or fewer eval batches, in the script's own flags"

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        eval_s = p.seconds("eval")
        if eval_s / p.wall_s < EVAL_SHARE:
            return None
        names = names_for(p)
        c = cadence(p)
        fig = _trainer(eval_s, p.wall_s, c, names) if names.is_trainer else _loop(eval_s, p.wall_s, c)
        return _word(fig, names)


def _trainer(eval_s: float, wall_s: float, c: EvalCadence, names: Names) -> EvalFigures:
    share = eval_s / wall_s
    current = names.current("eval_steps")
    eval_steps = nice_round_up(current * share / TARGET) if isinstance(current, (int, float)) and current > 0 else None
    batch = int(names.current("per_device_eval_batch_size") or 8) * 2 if names.has("per_device_eval_batch_size") else None
    return EvalFigures(eval_s, wall_s, c, share - TARGET, eval_steps=eval_steps, eval_batch_size=batch)


def _loop(eval_s: float, wall_s: float, c: EvalCadence) -> EvalFigures:
    if not (c.interval_steps and c.step_s and c.per_eval_s > 0):
        return EvalFigures(eval_s, wall_s, c, eval_s / wall_s - TARGET)
    need = c.per_eval_s * (1 - TARGET) / (TARGET * c.step_s)  # steps between evals for TARGET
    new_interval = c.interval_steps * max(2, math.ceil(need / c.interval_steps))  # a multiple of today's
    kept = c.interval_steps / new_interval  # the evals a longer interval keeps
    batches = max(1, int(c.batches * kept)) if c.batches else None
    return EvalFigures(eval_s, wall_s, c, (1 - kept) * eval_s / wall_s, new_interval=new_interval,
                       new_batches=batches if batches and c.batches and batches < c.batches else None)


def _word(fig: EvalFigures, names: Names) -> Finding:
    c = fig.cadence
    fix, alternative = _eval_fix(fig, names)
    return Finding(
        rule=EvalOverhead.name,
        title="Evaluation takes a large share of the run",
        claims=[claim("eval", max(0.0, fig.waste) * fig.wall_s, fig.eval_s)],
        evidence=_eval_evidence(fig),
        fix=fix,
        data={"eval_s": round(fig.eval_s, 3), "evals": c.evals, "per_eval_s": round(c.per_eval_s, 3),
              "current_eval_interval": c.interval_steps, "eval_batches": c.batches,
              **({"alternative": alternative} if alternative else {})},
    )


def _eval_fix(fig: EvalFigures, names: Names) -> tuple[Fix, dict[str, object]]:
    """The fix in the run's own terms, and the alternative (fewer batches per eval), if any."""
    c = fig.cadence
    if names.is_trainer:
        config: dict[str, object] = {}
        if fig.eval_steps is not None:
            config["eval_steps"] = fig.eval_steps
        if fig.eval_batch_size is not None:
            config["per_device_eval_batch_size"] = fig.eval_batch_size
        return Fix(summary="Evaluate less often or on a fixed subset, with a larger eval batch.",
                   config=config, library=names.library, call=names.call), {}
    if fig.new_interval is None or c.interval_steps is None:
        return Fix(summary=f"Evaluate less often, or on fewer batches each time: {plural(c.evals, 'eval')} took "
                   f"{c.per_eval_s:.2f} s each.", library=LOOP_LIBRARY), {}
    words = vocabulary.eval_fix(names, fig.new_interval, c.interval_steps)
    alt = (f", or keep it and run {fig.new_batches} batches per eval instead of {c.batches} ({words.batches_key})"
           if fig.new_batches else "")
    fix = Fix(summary=f"Evaluate every {fig.new_interval} steps instead of every {c.interval_steps} "
              f"({words.interval_key}){alt}, to keep evaluation near {int(TARGET * 100)}% of wall time.",
              config=words.config, snippet=words.snippet, library=words.library, call=words.call)
    return fix, ({words.batches_key: fig.new_batches} if alt else {})


def _eval_evidence(fig: EvalFigures) -> str:
    c = fig.cadence
    evidence = f"Evaluation took {fig.eval_s:.1f} s, {pct(fig.share)} of wall time"
    if c.evals:
        evidence += f": {c.evals} evals of {c.per_eval_s:.2f} s"
        if c.batches:
            evidence += f" ({c.batches} batches each)"
        if c.interval_steps:
            evidence += f", one every {c.interval_steps} steps"
            if c.step_s:
                evidence += f" of {1000 * c.step_s:.0f} ms"
    return evidence + "."
