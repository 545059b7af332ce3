"""The report's ``trial`` section: the fix tried, what the hooks really set, predicted vs achieved.

What was applied is taken from the trial's own ``applied`` events, not from what was asked:
a value the trial never got to set (no such call in the script, a library that refused it)
is listed under ``not_applied`` with the reason.
"""

from __future__ import annotations

import statistics
from typing import Any

from gpudoctor.core.schema import Applied, NotApplied, Pair, Trial
from gpudoctor.recording.records import Records
from gpudoctor.render.trial import ran, speedups
from gpudoctor.rules.knobs import Prediction
from gpudoctor.tryfix.plan import COMMAND_LINE, Plan
from gpudoctor.tryfix.steady import Rate

SIDE_EFFECTS = ("The trial ran the command itself, with its side effects (what it writes to paths the command line "
                "does not name: checkpoints, caches), and was "
                "stopped after its seconds of training.")


def applied_events(events: dict[int, Records]) -> list[Applied]:
    """Distinct ``applied`` events of a recording: which call got which values, in which process."""
    seen: list[Applied] = []
    for records in events.values():
        for e in records.applied:
            row: Applied = {"call": str(e.get("call")), "values": _dict(e.get("values")), "was": _dict(e.get("was")),
                   "skipped": _dict(e.get("skipped"))}
            if row not in seen:
                seen.append(row)
    return seen


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def not_applied(plan: Plan, applied: list[Applied] | None) -> list[NotApplied]:
    """What needs a code change, what a library refused, and what the trial never had a call for."""
    rows = plan.not_applied()
    if applied is None:  # no trial ran
        return rows
    by_call: dict[str, set[str]] = {}
    for row in applied:
        done = by_call.setdefault(row["call"], set())
        done.update(row["values"])
        for key, why in row["skipped"].items():
            rows.append({"call": row["call"], "key": key, "reason": str(why)})
            done.add(key)
    for part in plan.parts:
        for key in part.apply if part.target and part.target != COMMAND_LINE else ():
            if key not in by_call.get(str(part.call), set()):
                rows.append({"call": part.call, "key": key,
                             "reason": f"the trial made no {part.call} call the hooks could see"})
    return rows


def build(plan: Plan, *, prediction: Prediction | None, baseline: Rate | None, trial: Rate | None,
          applied: list[Applied] | None, seconds: float, trial_run: dict[str, Any] | None,
          notes: list[str], unmeasured: str | None = None, pairs: list[Pair] | None = None) -> Trial:
    """``pairs``: every pair of ``--pairs N`` (the first one is ``baseline`` and ``trial``); the
    achieved speedup is then the median of their ratios, each rate its side's median."""
    fix = plan.finding["fix"]
    b = baseline.steps_per_s if baseline else None
    t = trial.steps_per_s if trial else None
    achieved = t / b if b and t is not None else None
    measured = [p for p in pairs or [] if p.get("speedup") is not None]
    if pairs and len(pairs) > 1 and measured:  # the pairs measured stand, whichever they are
        b, t = (statistics.median(float(p[side] or 0.0) for p in measured)
                for side in ("baseline_steps_per_s", "trial_steps_per_s"))
        achieved, unmeasured = statistics.median(float(p["speedup"] or 0.0) for p in measured), None
    missing = not_applied(plan, applied)
    flags = {k: v for p in plan.parts if p.target == COMMAND_LINE for k, v in p.apply.items()}
    ran = trial_run is not None and bool(trial_run.get("command_edited"))
    if flags and trial_run is not None and not ran:
        missing += [{"call": None, "key": k, "reason": "the script's flag: the command could not be edited as "
                     "recorded, so the trial ran it as given (add the flag to try it)"} for k in flags]
    section: Trial = {
        "rule": plan.rule,
        "fix": fix,
        "values": {**{k: v for k, v in plan.spec().items() if k not in ("schema", "rule")},
                   **({COMMAND_LINE: flags} if flags and ran else {})},
        "unchanged": {str(p.call): p.unchanged for p in plan.parts if p.unchanged},
        "set_by_user": plan.user_set,
        "applied": applied or [],
        "not_applied": missing,
        "complete": (bool(applied) or (bool(flags) and ran)) and not missing,
        "predicted_speedup": _r(prediction.speedup) if prediction else None,
        "predicted_speedup_range": ([round(prediction.speedup or 1.0, 4), round(prediction.up_to, 4)]
                                    if prediction and prediction.up_to is not None else None),
        "prediction_basis": prediction.basis if prediction else None,
        "finding_predicted_speedup": plan.finding.get("predicted_speedup"),
        "achieved_speedup": _r(achieved),
        "baseline_steps_per_s": _r(b),
        "trial_steps_per_s": _r(t),
        "baseline": baseline.to_dict() if baseline else None,
        "trial": trial.to_dict() if trial else None,
        "seconds": seconds,
        "trial_run": trial_run,
        "unmeasured": unmeasured,
        "pairs": pairs if pairs and len(pairs) > 1 else None,
        "notes": notes,
    }
    if applied is not None:
        section["notes"] = [*notes, SIDE_EFFECTS]
    return section


def headline(section: Trial) -> str:
    """One terminal line: ``predicted 1.2x, achieved 1.15x (steps/s 8.1 -> 9.3)``."""
    rule = section.get("rule")
    if not ran(section):
        why = "; ".join([*(f"{call}({', '.join(f'{k}={v!r}' for k, v in values.items())}) is what the run "
                           "already used" for call, values in (section.get("unchanged") or {}).items()),
                         *(f"{r.get('call')}.{r.get('key')}: {r.get('reason')}"
                           for r in section.get("not_applied") or [])])
        return f"gpudoctor try: {rule}: nothing applied, no trial run" + (f" ({why})" if why else "")
    crash = (section.get("trial_run") or {}).get("crash")
    if isinstance(crash, dict):
        said = "; ".join(str(x) for x in crash.get("last_lines") or []) or "no exception recorded"
        code = (f"exit code {crash.get('exit_code')}" + (" as try stopped it while it was exiting"
                                                         if crash.get("stopped_while_exiting") else ""))
        return (f"gpudoctor try: {rule}: the trial with the fix CRASHED after {crash.get('steps')} steps ({code}): "
                f"{said}; nothing measured; its output is above, its recording in "
                f"{(section.get('trial_run') or {}).get('folder')}/")
    return f"gpudoctor try: {rule}: {speedups(section)}"


def _r(x: float | None) -> float | None:
    return round(x, 4) if isinstance(x, (int, float)) else None


def pair(rates: tuple[Rate, Rate] | None, folder: str, unmeasured: str | None) -> Pair:
    """One before/after pair's rates and ratio (none where it could not be measured)."""
    b, t = (rates[0].steps_per_s, rates[1].steps_per_s) if rates else (None, None)
    return {"baseline_steps_per_s": _r(b), "trial_steps_per_s": _r(t), "speedup": _r(t / b) if b and t is not None else None,
            "folder": folder, "unmeasured": None if b and t is not None else
            unmeasured or "steady-state steps/s unavailable: too few steps; raise --seconds"}
