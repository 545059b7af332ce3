"""The report dict every renderer consumes (and ``report.json`` stores).

It is SPEC.md's ``gpudoctor.report/1`` plus keys renderers need to draw a run
from ``report.json`` alone (so ``gpudoctor report report.json -o x.html`` needs
no raw samples). Extra keys, beyond SPEC.md:

run:       ``exit_code`` (int|null), ``status`` ("finished"|"crashed"|"interrupted"|
           "partial"), ``gpudoctor_version``, ``doctor_priority`` ({"cpu", "io", ...} from
           meta.json: the doctor's own CPU and I/O priority; null for the in-process API).
cost:      ``usd_per_hour``/``wasted_usd_per_hour`` are null when no price is known
           (no GPU seen and none given); ``wasted_usd_so_far`` (f|null),
           ``projected_run_hours`` (f|null), ``projected_run_usd`` (f|null),
           ``projected_wasted_usd`` (f|null), ``price_source`` (str).
findings:  each also has ``title`` (str) and ``data`` ({name: number|str}, the figures
           the evidence cites); ``fix.library`` names whose names ``fix.config``
           uses (e.g. "transformers 5.23.0 TrainingArguments").
           ``waste_usd_per_hour`` is null when no price is known.
           ``claims``: [{"bucket", "part" (str|null), "part_share", "fraction"}], the
           seconds of the breakdown the fix gives back (see :mod:`gpudoctor.rules.account`);
           ``waste_fraction`` and ``predicted_speedup`` are these claims settled alone,
           ``cost.wasted_fraction`` all findings' claims settled together.
per_rank:  [{"rank": int, "pid": int, "breakdown": {...}, "steps": {...}}] (one
           entry per training process; a single process is rank 0).
timeline:  {"duration_s": f,
            "series": {"t_s": [f], "gpu_busy_pct": [f]|null, "cpu_pct": [f],
                       "rss_mib": [f]},
            "spans": {"startup": [[s, e]], "data_wait": [[s, e]...],
                      "checkpoint": [...], "eval": [...], "format": [...]},
            "steps_t_s": [f]}          (seconds since run start, downsampled)
notes:     [str]   (partial recording, skipped lines, ...)

Only from ``gpudoctor replay``:
preflight:         the full run predicted on ``--target`` before and after the fixes
                   (``gpudoctor.preflight/1``, see :mod:`gpudoctor.replay.preflight`).
prediction_check:  a replay that ran on a GPU: {"gpu", "known", "target", "mfu_assumed",
                   "mfu_achieved", "precision", "rows": [{"figure", "unit", "predicted",
                   "measured", "measured_over_predicted"}], "notes"} (:mod:`gpudoctor.replay.here`).

Only from ``gpudoctor try`` (the baseline's report; the trial's recording is in ``trial/``):
trial:  {"rule", "fix" (the finding's fix), "values" ({section: {key: value}} asked),
         "unchanged", "set_by_user", "applied" ([{"call", "values", "was", "skipped"}], from the
         trial's own ``applied`` events), "not_applied" ([{"call", "key", "reason"}]: needs a code
         change, refused, or no such call seen), "complete" (bool), "predicted_speedup" (f|null,
         steady-state steps/s after over before), "predicted_speedup_range" ([lo, hi]|null),
         "prediction_basis" (str|null), "finding_predicted_speedup" (the finding's, on wall time),
         "achieved_speedup" (f|null, trial_steps_per_s / baseline_steps_per_s),
         "baseline_steps_per_s", "trial_steps_per_s" (f|null), "baseline"/"trial" ({"steps_per_s",
         "steps", "warmup_steps", "window_s"}|null), "seconds", "trial_run" ({"folder", "exit_code",
         "stopped", "status", "window_s"}|null: null when nothing could be applied), "notes"}
         (:mod:`gpudoctor.tryfix.section`).
"""

from __future__ import annotations

SCHEMA = "gpudoctor.report/1"
BREAKDOWN_KEYS = ("startup", "data_wait", "compute", "checkpoint", "eval", "other")
SEVERITIES = ("high", "medium", "low", "info")
