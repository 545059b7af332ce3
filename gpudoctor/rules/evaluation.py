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
from gpudoctor.recording.events import EVAL_FORWARDS as FORWARDS
from gpudoctor.rules import vocabulary
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.names import Names, names_for
from gpudoctor.rules.values import nice_round_up

MIN_SHARE = 0.10
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
    forwards = sum(int(e.get("calls") or 0) for e in p.events if e.get("k") == "counter" and e.get("name") == FORWARDS)
    steps = len(times)
    loop_s = p.seconds("compute") + p.seconds("data_wait") + p.seconds("checkpoint")
    return EvalCadence(
        evals=len(evals),
        per_eval_s=statistics.fmean(b - a for a, b in evals) if evals else 0.0,
        interval_steps=round(statistics.median(gaps)) if gaps else None,
        batches=round(forwards / len(evals)) if forwards and evals else None,
        step_s=loop_s / steps if steps and loop_s > 0 else None,
    )


class EvalOverhead(Rule):
    name = "eval_overhead"
    fires_when = "evaluation ≥ 10% of wall (Trainer, Lightning, or a hand-written loop's forwards without backward)"
    fix_from = "Trainer: `eval_steps` scaled to 5%, a larger eval batch; a hand-written loop: a longer eval interval or fewer eval batches, in the script's own flags"

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        eval_s = p.seconds("eval")
        share = eval_s / p.wall_s
        if share < MIN_SHARE:
            return None
        names = names_for(p)
        c = cadence(p)
        if names.is_trainer:
            return self._trainer(p, names, share, c)
        return self._loop(p, share, c, names)

    def _trainer(self, p: ProcessView, names, share: float, c: EvalCadence) -> Finding:  # type: ignore[no-untyped-def]
        current = names.current("eval_steps")
        config: dict[str, object] = {}
        if isinstance(current, (int, float)) and current > 0:
            config["eval_steps"] = nice_round_up(current * share / TARGET)
        if names.has("per_device_eval_batch_size"):
            bs = names.current("per_device_eval_batch_size") or 8
            config["per_device_eval_batch_size"] = int(bs) * 2
        return self._finding(p, share, c, share - TARGET, Fix(
            summary="Evaluate less often or on a fixed subset, with a larger eval batch.",
            config=config, library=names.library, call=names.call))

    def _loop(self, p: ProcessView, share: float, c: EvalCadence, names: Names) -> Finding:
        eval_s = p.seconds("eval")
        if not (c.interval_steps and c.step_s and c.per_eval_s > 0):
            return self._finding(p, share, c, share - TARGET, Fix(
                summary=f"Evaluate less often, or on fewer batches each time: {plural(c.evals, 'eval')} took "
                f"{c.per_eval_s:.2f} s each.", library="your training loop"))
        need = c.per_eval_s * (1 - TARGET) / (TARGET * c.step_s)  # steps between evals for TARGET
        new_interval = c.interval_steps * max(2, math.ceil(need / c.interval_steps))  # a multiple of today's
        kept = c.interval_steps / new_interval  # the evals a longer interval keeps
        batches = max(1, int(c.batches * kept)) if c.batches else None
        words = vocabulary.eval_fix(names, new_interval, c.interval_steps)
        alt = (f", or keep it and run {batches} batches per eval instead of {c.batches} ({words.batches_key})"
               if batches and c.batches and batches < c.batches else "")
        return self._finding(p, share, c, (1 - kept) * eval_s / p.wall_s, Fix(
            summary=f"Evaluate every {new_interval} steps instead of every {c.interval_steps} "
            f"({words.interval_key}){alt}, to keep evaluation near {int(TARGET * 100)}% of wall time.",
            config=words.config, snippet=words.snippet, library=words.library, call=words.call),
            alternative={words.batches_key: batches} if alt else {})

    def _finding(self, p: ProcessView, share: float, c: EvalCadence, waste: float, fix: Fix,
                 alternative: dict[str, object] | None = None) -> Finding:
        eval_s = p.seconds("eval")
        evidence = f"Evaluation took {eval_s:.1f} s, {pct(share)} of wall time"
        if c.evals:
            evidence += f": {c.evals} evals of {c.per_eval_s:.2f} s"
            if c.batches:
                evidence += f" ({c.batches} batches each)"
            if c.interval_steps:
                evidence += f", one every {c.interval_steps} steps"
                if c.step_s:
                    evidence += f" of {1000 * c.step_s:.0f} ms"
        return Finding(
            rule=self.name,
            title="Evaluation takes a large share of the run",
            claims=[claim("eval", max(0.0, waste) * p.wall_s, eval_s)],
            evidence=evidence + ".",
            fix=fix,
            data={"eval_s": round(eval_s, 3), "evals": c.evals, "per_eval_s": round(c.per_eval_s, 3),
                  "current_eval_interval": c.interval_steps, "eval_batches": c.batches,
                  **({"alternative": alternative} if alternative else {})},
        )
