"""Rules for time spent saving checkpoints."""

from __future__ import annotations

import bisect
import statistics

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.saves import split_saves
from gpudoctor.common.wording import plural
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import (
    Finding,
    Fix,
    Rule,
    pct,
)
from gpudoctor.rules.names import names_for
from gpudoctor.rules.values import CHECKPOINT_TARGET, save_steps_for

MIN_SHARE = 0.05


class CheckpointOverhead(Rule):
    name = "checkpoint_overhead"
    fires_when = 'saving ≥ 5% of wall'
    fix_from = '`save_steps` that brings saving under 2% (measured seconds per save ÷ step time), rounded to 1/2/5×10ⁿ; `save_only_model`; also gives back the steps a save slows'

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        kinds = split_saves(p)  # the final save and side files are not "saving too often"
        saves = kinds.checkpoints
        share = tl.total(saves) / p.wall_s
        if share < MIN_SHARE or not saves:
            return None
        names = names_for(p)
        per_save_s = statistics.fmean(b - a_ for a_, b in saves)
        step_s = statistics.median(p.step_intervals_s()) if len(p.step_times) > 2 else None
        current = names.current("save_steps")
        if not isinstance(current, (int, float)) or current <= 0 or (isinstance(current, float) and current < 1):
            current = round(len(p.step_times) / len(saves)) if p.step_times else None
        # Steady-state step time without saving, so the saving itself does not inflate it.
        compute_step_s = step_s
        if step_s and p.step_times:
            compute_step_s = max(1e-6, (p.seconds("compute") + p.seconds("data_wait")) / len(p.step_times))
        config: dict[str, object] = {}
        waste = share
        if compute_step_s:
            new_steps = save_steps_for(per_save_s, compute_step_s)
            config["save_steps"] = new_steps
            new_share = per_save_s / (per_save_s + new_steps * compute_step_s)
            waste = max(0.0, share - new_share * (1 - a.share("startup")))
        if names.is_trainer and names.has("save_only_model") and not names.current("save_only_model"):
            config["save_only_model"] = True
        claims = [claim("checkpoint", waste * p.wall_s, p.seconds("checkpoint"))]
        slow_s, slow_up_to_s = _after_save_excess_s(p.step_times, saves)
        new_steps = config.get("save_steps")
        if slow_up_to_s > 0 and isinstance(new_steps, int) and p.step_times:
            # Fewer saves also spare the steps a save slows down after it (fsync, page cache):
            # seconds beyond a normal step, in compute, removed in proportion to the saves dropped.
            kept = min(1.0, len(p.step_times) / new_steps / len(saves))
            claims.append(claim("compute", (1 - kept) * slow_s, p.seconds("compute"), part="after_save",
                                part_s=slow_up_to_s, up_to_s=(1 - kept) * slow_up_to_s))
        top = max(p.span_names.get("checkpoint", {}).items(), key=lambda kv: kv[1], default=("save", 0))[0]
        snippet = (
            f"TrainingArguments(..., save_steps={config.get('save_steps')}"
            + (", save_only_model=True" if "save_only_model" in config else "")
            + ")"
            if names.is_trainer
            else f"if step % {config.get('save_steps')} == 0:\n    torch.save(state, path)"
        )
        return Finding(
            rule=self.name,
            title="Checkpoints are saved too often",
            claims=claims,
            evidence=(
                f"{len(saves)} checkpoint saves ({top}) took {per_save_s:.2f} s each, {pct(share)} of wall time"
                + (f", one every {current} steps" if current else "")
                + (f" of {1000 * compute_step_s:.0f} ms" if compute_step_s else "")
                + (f"; the step after each save ran {slow_up_to_s / len(saves):.2f} s slower than a normal "
                   "one" if slow_up_to_s > 0 else "")
                + (f"; besides them, the final save took {tl.total(kinds.final):.2f} s" if kinds.final else "")
                + (f" and {plural(len(kinds.side), 'side file')} without tensors" if kinds.side else "")
                + "."
            ),
            fix=Fix(
                summary=f"Save every {config.get('save_steps')} steps to keep saving under "
                f"{int(CHECKPOINT_TARGET * 100)}% of wall time"
                + (" and skip optimizer state in intermediate saves" if "save_only_model" in config else "")
                + ".",
                config=config,
                snippet=snippet,
                library=names.library if names.is_trainer else "your training loop",
                call=names.call if names.is_trainer else None,
            ),
            data={"saves": len(saves), "final_saves": len(kinds.final), "side_files": len(kinds.side),
                  "per_save_s": round(per_save_s, 3), "current_save_steps": current,
                  "after_save_excess_s": round(slow_up_to_s, 3)},
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
