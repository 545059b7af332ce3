"""Rules for time spent saving checkpoints and evaluating."""

from __future__ import annotations

import statistics

from gpudoctor.analysis import Analysis
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import (
    Finding,
    Fix,
    Rule,
    pct,
    register,
)
from gpudoctor.rules.names import names_for
from gpudoctor.rules.values import CHECKPOINT_TARGET, nice_round_up, save_steps_for

MIN_SHARE = 0.05


@register
class CheckpointOverhead(Rule):
    name = "checkpoint_overhead"
    description = "Saving checkpoints takes a real share of the run."

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        share = p.seconds("checkpoint") / p.wall_s
        saves = p.spans.get("checkpoint", [])
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
            claims=[claim("checkpoint", waste * p.wall_s, p.seconds("checkpoint"))],
            evidence=(
                f"{len(saves)} saves ({top}) took {per_save_s:.2f} s each, {pct(share)} of wall time"
                + (f", one every {current} steps" if current else "")
                + (f" of {1000 * compute_step_s:.0f} ms" if compute_step_s else "")
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
            data={"saves": len(saves), "per_save_s": round(per_save_s, 3), "current_save_steps": current},
        )


@register
class EvalOverhead(Rule):
    name = "eval_overhead"
    description = "Evaluation takes a large share of the run."

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        share = p.seconds("eval") / p.wall_s
        if share < 0.10:
            return None
        names = names_for(p)
        target = 0.05
        current = names.current("eval_steps")
        factor = share / target
        config: dict[str, object] = {}
        if isinstance(current, (int, float)) and current > 0:
            config["eval_steps"] = nice_round_up(current * factor)
        if names.has("per_device_eval_batch_size"):
            bs = names.current("per_device_eval_batch_size") or 8
            config["per_device_eval_batch_size"] = int(bs) * 2
        waste = share - target
        return Finding(
            rule=self.name,
            title="Evaluation takes a large share of the run",
            claims=[claim("eval", waste * p.wall_s, p.seconds("eval"))],
            evidence=f"Evaluation took {p.seconds('eval'):.1f} s, {pct(share)} of wall time.",
            fix=Fix(
                summary="Evaluate less often or on a fixed subset, with a larger eval batch.",
                config=config,
                snippet=None,
                library=names.library,
                call=names.call,
            ),
            data={"eval_s": round(p.seconds("eval"), 3)},
        )
