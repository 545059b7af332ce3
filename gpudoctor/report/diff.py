"""Before/after comparison of two reports, for a pull request.

:func:`diff_reports` is a pure function of two report dicts; the renderers turn
its result into Markdown (a PR comment) or one self-contained HTML page. A
figure missing on either side gives a null delta, never a made-up one.

Two runs have different wall times, so shares of wall time are not compared:
every conclusion comes from **seconds per training step** (p50 step time,
steps/s, and each breakdown bucket's seconds divided by the steps) and, for
startup, **seconds per launch**. A change counts only beyond the noise the two
runs show in their own step times (:mod:`gpudoctor.analysis.step_noise`); inside it, the
change is ``"within_noise"`` and drawn neutral. Startup is one launch per run, so
its own noise cannot be observed: it is held to the same *relative* noise as the
steps (``threshold_s_per_step`` / before p50, times the startup seconds).

A finding that is no longer reported is ``resolved`` only when the seconds it
claimed (its ``claims`` on the breakdown's buckets, or :data:`RULE_BUCKETS` for
reports from before claims) fell beyond the noise. When they did not and
another finding now claims the same bucket, the waste was ``moved`` (relabelled),
not removed; with nothing in its place it is ``gone`` (no longer reported, not
confirmed by the seconds). When they fell beyond the noise but more than the
noise of them is left, it is ``partial``.

JSON (``schema`` ``gpudoctor.diff/2``), besides ``before``/``after``/``notes``/``summary``:

* ``noise``: ``{"before", "after"}`` each ``{"method", "steps", "spread_s",
  "drift_s", "noise_s"}``; ``threshold_s_per_step``, ``relative`` (that over the
  before p50) and ``threshold_s_per_launch`` (startup); null: unobservable.
* ``steps``: ``{"before", "after", "delta"}`` step counts.
* ``sections``: ``{"before", "after"}``, the optional sections each report holds (trial,
  preflight, ...; :data:`gpudoctor.core.schema.SECTIONS`); one only one side has is noted.
* ``step_time_p50_s`` and ``throughput_steps_per_s``: ``{"before", "after",
  "delta", "verdict"}`` (throughput adds ``ratio`` = after/before steps/s).
  ``verdict`` is ``"better"``, ``"worse"``, ``"within_noise"`` or ``"unavailable"``.
* ``seconds``: per bucket ``{"unit": "s/step" | "s/launch", "before", "after",
  "delta", "verdict"}``; ``breakdown`` keeps the shares of each run's wall time
  (shown, never judged).
* ``findings``: lists ``resolved``, ``partial``, ``moved``, ``gone``, ``new``, ``still_present``
  of entries ``{"rule", "title", "severity", "severity_before", "severity_after",
  "bucket", "unit", "waste_s", "bucket_s", "verdict", "moved_to", "speedup",
  "waste_fraction", "waste_usd_per_hour"}``: ``waste_s`` is the finding's seconds
  per step (per launch for startup) as ``{"before", "after", "delta"}`` (for a
  finding no longer reported, ``after`` is what its bucket's fall does not
  account for); ``bucket_s`` the seconds of the bucket it lives in, with its
  ``verdict``; ``moved_to`` the rules now claiming that bucket; ``speedup`` is
  ``{"predicted", "achieved", "basis"}`` where the before-run predicted one and the
  after-run applied the fix (finding gone, or its bucket fell), else null.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.analysis import step_noise
from gpudoctor.common.numbers import num
from gpudoctor.common.wording import command_text, gpus_text
from gpudoctor.core.schema import (
    DIFF_STATUSES,
    SECTIONS,
    Change,
    Diff,
    Finding,
    Report,
    Side,
    breakdown_items,
)
from gpudoctor.rules.account import BUCKETS, Claim, removed_of_bucket

DIFF_SCHEMA = "gpudoctor.diff/2"
PER_LAUNCH = frozenset({"startup"})  # paid once per launch, not per step
# Where a finding lives, for reports written before findings carried ``claims``.
RULE_BUCKETS = {
    "tokenization_in_loop": "data_wait",
    "data_stall": "data_wait",
    "io_bound": "data_wait",
    "cpu_saturated": "data_wait",
    "startup_idle": "startup",
    "checkpoint_overhead": "checkpoint",
    "eval_overhead": "eval",
    "padding_waste": "compute",
    "low_gpu_utilization": "compute",
    "gpu_memory_underused": "compute",
    "no_tf32": "compute",
    "no_mixed_precision": "compute",
    "straggler_rank": "compute",
}
STATUSES = DIFF_STATUSES


def change(before: Any, after: Any) -> Change:
    """``{"before", "after", "delta"}`` with ``delta = after - before`` when both are known."""
    b, a = num(before), num(after)
    return {"before": b, "after": a, "delta": None if a is None or b is None else a - b}


def verdict(delta: float | None, threshold: float | None, lower_is_better: bool = True) -> str:
    """``better``/``worse`` only beyond the noise threshold; ``within_noise`` inside it."""
    if delta is None or threshold is None:
        return "unavailable"
    if abs(delta) <= threshold:
        return "within_noise"
    return "better" if (delta < 0) == lower_is_better else "worse"


def unit_of(bucket: str | None) -> str | None:
    if bucket is None:
        return None
    return "s/launch" if bucket in PER_LAUNCH else "s/step"


class RunSeconds:
    """One report's figures in seconds: per step, or per launch for startup."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.duration_s = num((report.get("run") or {}).get("duration_s"))
        steps = report.get("steps") or {}
        count = num(steps.get("count"))
        self.steps = int(count) if count is not None and count > 0 else None
        self.p50_s = num((steps.get("step_time_s") or {}).get("p50"))
        self.shares = dict(breakdown_items(report.get("breakdown")))
        self.noise = step_noise.estimate(report)

    def per_unit(self, bucket: str, wall_s: float | None) -> float | None:
        """Seconds of the whole run in ``bucket`` -> seconds per step (per launch for startup)."""
        if wall_s is None:
            return None
        if bucket in PER_LAUNCH:
            return wall_s
        return wall_s / self.steps if self.steps else None

    def bucket_s(self, bucket: str) -> float | None:
        share = self.shares.get(bucket)
        if share is None or self.duration_s is None:
            return None
        return self.per_unit(bucket, share * self.duration_s)

    def loop_s(self) -> float | None:
        """Seconds per training step, every bucket but startup (checkpoints and eval included)."""
        parts = [self.bucket_s(k) for k in self.shares if k not in PER_LAUNCH]
        return None if not parts or any(p is None for p in parts) else sum(p for p in parts if p)

    def waste_wall_s(self, finding: Finding) -> dict[str, float]:
        """Seconds of this run each bucket gives back when the finding's fix is applied alone."""
        if self.duration_s is None:
            return {}
        by_bucket: dict[str, list[Claim]] = {}
        for c in finding.get("claims") or []:
            if not isinstance(c, dict) or c.get("bucket") not in BUCKETS:
                continue
            share = num(c.get("part_share"))
            by_bucket.setdefault(c["bucket"], []).append(
                Claim(c["bucket"], num(c.get("fraction")) or 0.0, str(c.get("part") or ""),
                      1.0 if share is None else share)
            )
        if by_bucket:
            return {b: removed_of_bucket(cs) * (self.shares.get(b) or 0.0) * self.duration_s
                    for b, cs in by_bucket.items()}
        bucket = RULE_BUCKETS.get(str(finding.get("rule")))
        waste = num(finding.get("waste_fraction"))
        if bucket is None or not waste or finding.get("claims"):
            return {}
        share = self.shares.get(bucket)
        return {bucket: (waste if share is None else min(waste, share)) * self.duration_s}


class Noise:
    """The smallest change that is not noise, per step and (in proportion) per launch."""

    def __init__(self, rb: RunSeconds, ra: RunSeconds) -> None:
        self.per_step = step_noise.threshold(rb.noise, ra.noise)
        self.relative = self.per_step / rb.p50_s if self.per_step is not None and rb.p50_s else None
        startup = [s for s in (rb.bucket_s("startup"), ra.bucket_s("startup")) if s is not None]
        self.per_launch = self.relative * max(startup) if self.relative is not None and startup else None

    def of(self, bucket: str | None) -> float | None:
        return self.per_launch if bucket in PER_LAUNCH else self.per_step

    def to_dict(self, rb: RunSeconds, ra: RunSeconds) -> dict[str, Any]:
        return {"before": rb.noise.to_dict(), "after": ra.noise.to_dict(),
                "threshold_s_per_step": self.per_step, "relative": self.relative,
                "threshold_s_per_launch": self.per_launch}


def _home(wall: dict[str, float]) -> str | None:
    """The bucket holding most of a finding's seconds."""
    positive = {b: s for b, s in wall.items() if s > 0}
    return max(positive, key=lambda b: positive[b]) if positive else None


def _same_unit(wall: dict[str, float], bucket: str | None) -> list[str]:
    return [b for b, s in wall.items() if s > 0 and unit_of(b) == unit_of(bucket)]


def _waste_s(run: RunSeconds, wall: dict[str, float], bucket: str | None) -> float | None:
    if bucket is None:
        return 0.0
    parts = [run.per_unit(b, wall[b]) for b in _same_unit(wall, bucket)]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def achieved_speedup(b: RunSeconds, a: RunSeconds, bucket: str | None) -> tuple[float | None, str]:
    """What the after-run achieved: the ratio of seconds per training step, or for a startup fix
    the before run's wall against that wall less the startup seconds saved."""
    if bucket in PER_LAUNCH:
        sb, sa = b.bucket_s("startup"), a.bucket_s("startup")
        basis = "wall time of the before run, less the startup saved"
        if b.duration_s is None or sb is None or sa is None or b.duration_s - (sb - sa) <= 0:
            return None, basis
        return b.duration_s / (b.duration_s - (sb - sa)), basis
    lb, la = b.loop_s(), a.loop_s()
    if lb and la:
        return lb / la, "seconds per step after startup, before / after"
    return (b.p50_s / a.p50_s if b.p50_s and a.p50_s else None), "p50 step time, before / after"


def _by_rule(report: Report) -> dict[str, Finding]:
    """The largest-waste finding of each rule (a rule may fire once per rank); no info findings."""
    rules: dict[str, Finding] = {}
    for finding in report.get("findings") or []:
        if not isinstance(finding, dict) or finding.get("severity") == "info":
            continue
        rule = str(finding.get("rule") or "unknown")
        seen = rules.get(rule)
        if seen is None or (num(finding.get("waste_fraction")) or 0) > (
            num(seen.get("waste_fraction")) or 0
        ):
            rules[rule] = finding
    return rules


def diff_findings(before: Report, after: Report) -> dict[str, list[dict[str, Any]]]:
    """Findings by what happened to their seconds: resolved, partial, moved, gone, new, still_present."""
    rb, ra = RunSeconds(before), RunSeconds(after)
    noise = Noise(rb, ra)
    fb, fa = _by_rule(before), _by_rule(after)
    wall_b = {r: rb.waste_wall_s(f) for r, f in fb.items()}
    wall_a = {r: ra.waste_wall_s(f) for r, f in fa.items()}
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in STATUSES}
    targets: set[str] = set()

    def entry(rule: str, bucket: str | None, wb: float | None, wa: float | None) -> dict[str, Any]:
        f = fa.get(rule) or fb[rule]
        sev_b = str(fb[rule].get("severity") or "low") if rule in fb else None
        sev_a = str(fa[rule].get("severity") or "low") if rule in fa else None
        bs = change(rb.bucket_s(bucket), ra.bucket_s(bucket)) if bucket else change(None, None)
        return {
            "rule": rule,
            "title": str(f.get("title") or rule),
            "severity": sev_a or sev_b,
            "severity_before": sev_b,
            "severity_after": sev_a,
            "bucket": bucket,
            "unit": unit_of(bucket),
            "waste_s": change(wb, wa),
            "bucket_s": {**bs, "verdict": verdict(bs["delta"], noise.of(bucket))},
            "verdict": verdict(None if wb is None or wa is None else wa - wb, noise.of(bucket)),
            "moved_to": [],
            "speedup": None,
            "waste_fraction": change(fb[rule].get("waste_fraction") if rule in fb else None,
                                     fa[rule].get("waste_fraction") if rule in fa else None),
            "waste_usd_per_hour": change(fb[rule].get("waste_usd_per_hour") if rule in fb else None,
                                         fa[rule].get("waste_usd_per_hour") if rule in fa else None),
        }

    def with_speedup(e: dict[str, Any]) -> dict[str, Any]:
        # Like with like: a startup fix's whole-run figure beside the wall it saved, any other
        # fix's steady-state figure beside the seconds per step (reports before the split
        # carried one figure, the whole run's, in ``predicted_speedup``).
        f = fb[e["rule"]]
        whole = e["bucket"] in PER_LAUNCH and f.get("whole_run_speedup") is not None
        predicted = num(f.get("whole_run_speedup") if whole else f.get("predicted_speedup"))
        if predicted is not None:
            achieved, basis = achieved_speedup(rb, ra, e["bucket"])
            e["speedup"] = {"predicted": predicted, "achieved": achieved, "basis": basis}
        return e

    for rule in fb:
        bucket = _home(wall_b[rule])
        wb = _waste_s(rb, wall_b[rule], bucket)
        if rule in fa:
            e = entry(rule, bucket, wb, _waste_s(ra, wall_a[rule], bucket))
            out["still_present"].append(with_speedup(e) if e["bucket_s"]["verdict"] == "better" else e)
            continue
        removed, t = _removed_s(rb, ra, wall_b[rule], bucket), noise.of(bucket)
        left = None if removed is None or wb is None else wb - removed
        e = with_speedup(entry(rule, bucket, wb, left))
        if removed is not None and left is not None and t is not None and removed > t and left <= t:
            out["resolved"].append(e)
            continue
        e["moved_to"] = [
            r for r in fa
            if bucket is not None and wall_a[r].get(bucket, 0.0) > 0
            and (r not in fb or _grew(rb, ra, wall_b[r], wall_a[r], bucket, t))
        ]
        targets.update(e["moved_to"])
        fell = removed is not None and t is not None and removed > t
        out["partial" if fell else "moved" if e["moved_to"] else "gone"].append(e)
    for rule in fa:
        if rule not in fb and rule not in targets:
            bucket = _home(wall_a[rule])
            out["new"].append(entry(rule, bucket, None, _waste_s(ra, wall_a[rule], bucket)))
    return out


def _removed_s(b: RunSeconds, a: RunSeconds, wall: dict[str, float], bucket: str | None) -> float | None:
    """How much of a finding's seconds its buckets' fall accounts for (0 when they did not fall)."""
    if bucket is None:
        return 0.0
    removed = 0.0
    for key in _same_unit(wall, bucket):
        sb, sa, mine = b.bucket_s(key), a.bucket_s(key), b.per_unit(key, wall[key])
        if sb is None or sa is None or mine is None:
            return None
        removed += min(mine, max(0.0, sb - sa))
    return removed


def _grew(b: RunSeconds, a: RunSeconds, wall_b: dict[str, float], wall_a: dict[str, float],
          bucket: str, threshold_s: float | None) -> bool:
    wb, wa = _waste_s(b, wall_b, bucket), _waste_s(a, wall_a, bucket)
    return verdict(None if wb is None or wa is None else wa - wb, threshold_s) == "worse"


def _side(report: Report) -> Side:
    run = report.get("run") or {}
    return {
        "command": command_text(run.get("command")),
        "started_at": run.get("started_at"),
        "status": run.get("status"),
        "gpus": gpus_text(run),
        "verdict": report.get("verdict"),
        "breakdown": dict(breakdown_items(report.get("breakdown"))),
    }


def throughput(before: Report, after: Report) -> dict[str, float | None]:
    """Steps per second (1 / p50 step time) and the after/before ratio."""
    b, a = RunSeconds(before).p50_s, RunSeconds(after).p50_s
    c = change(1 / b if b else None, 1 / a if a else None)
    return {"before": c["before"], "after": c["after"], "delta": c["delta"], "ratio": b / a if a and b else None}


def diff_reports(before: Report, after: Report) -> Diff:
    """Everything that changed between two runs, in seconds per step and rule names: figures only
    (:mod:`gpudoctor.render.diff_words` words them: the notes and the summary line)."""
    rb, ra = RunSeconds(before), RunSeconds(after)
    noise = Noise(rb, ra)
    b_cost, a_cost = before.get("cost") or {}, after.get("cost") or {}
    step: dict[str, Any] = {**change(rb.p50_s, ra.p50_s)}
    step["verdict"] = verdict(step["delta"], noise.per_step)
    rate: dict[str, Any] = throughput(before, after)
    rate["verdict"] = step["verdict"]
    keys = list(dict.fromkeys([*rb.shares, *ra.shares]))
    seconds = {}
    for key in keys:
        c = change(rb.bucket_s(key), ra.bucket_s(key))
        seconds[key] = {"unit": unit_of(key), **c, "verdict": verdict(c["delta"], noise.of(key))}
    return {
        "schema": DIFF_SCHEMA,
        "before": _side(before),
        "after": _side(after),
        "noise": noise.to_dict(rb, ra),
        "duration_s": change(rb.duration_s, ra.duration_s),
        "steps": change(rb.steps, ra.steps),
        "step_time_p50_s": step,
        "throughput_steps_per_s": rate,
        "seconds": seconds,
        "breakdown": {k: change(rb.shares.get(k), ra.shares.get(k)) for k in keys},
        "wasted_fraction": change(b_cost.get("wasted_fraction"), a_cost.get("wasted_fraction")),
        "wasted_usd_per_hour": change(
            b_cost.get("wasted_usd_per_hour"), a_cost.get("wasted_usd_per_hour")
        ),
        "findings": diff_findings(before, after),
        "sections": {"before": present_sections(before), "after": present_sections(after)},
    }


def present_sections(report: Report) -> list[str]:
    """The registered optional sections (:data:`~gpudoctor.core.schema.SECTIONS`) a report holds."""
    return [s.key for s in SECTIONS if report.get(s.key) not in (None, [], {})]
