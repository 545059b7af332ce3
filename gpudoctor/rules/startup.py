"""Time before the first training step: idle GPUs while the CPU formats data."""

from __future__ import annotations

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct, register

MIN_RECOVERABLE_SHARE = 0.05
LONG_STARTUP_S = 60.0


@register
class StartupIdle(Rule):
    name = "startup_idle"
    description = "Work done before the first step that could be done before renting the GPUs."

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        startup_s = p.seconds("startup")
        if startup_s <= 0:
            return None
        first = p.first_step if p.first_step is not None else p.end
        before = {c: tl.total(tl.clip(tl.merge(s), p.start, first)) for c, s in p.spans.items()}
        format_s = before.get("format", 0.0)
        load_s = before.get("model_load", 0.0)
        data_load_s = before.get("data_load", 0.0)
        tok_s = p.tokenize_s - p.tokenize_in_loop_s
        recoverable_s = max(format_s, tok_s)
        share = recoverable_s / p.wall_s
        if share < MIN_RECOVERABLE_SHARE and recoverable_s < LONG_STARTUP_S:
            return None
        other_s = max(0.0, startup_s - format_s - load_s - data_load_s)
        names = sorted(p.span_names.get("format", {}).items(), key=lambda kv: -kv[1])
        what = ", ".join(f"{n} {s:.1f} s" for n, s in names[:3]) or "tokenizer calls"
        cores = a.host.cores or 1
        return Finding(
            rule=self.name,
            title="GPUs idle while the data is prepared",
            claims=[claim("startup", recoverable_s, startup_s)],
            per_launch_s=recoverable_s,
            evidence=(
                f"The first step started {startup_s:.1f} s after launch ({pct(startup_s / p.wall_s)} of wall): "
                f"{recoverable_s:.1f} s preparing data ({what}), {data_load_s:.1f} s loading the dataset, "
                f"{load_s:.1f} s loading the model, "
                f"{other_s:.1f} s in imports and other setup."
            ),
            fix=Fix(
                summary="Format and tokenize once before the GPUs are rented (batched, in parallel), save with "
                "save_to_disk, and only load_from_disk in the training script.",
                config={"batched": True, "num_proc": cores},
                snippet=(
                    "# prepare_data.py — run once on a CPU machine\n"
                    f"ds = ds.map(format_fn, batched=True, num_proc={cores})\n"
                    "ds.save_to_disk('data/formatted')\n"
                    "# train.py\n"
                    "ds = datasets.load_from_disk('data/formatted')"
                ),
                library="datasets.Dataset.map",
                call="ds.map",
            ),
            data={
                "startup_s": round(startup_s, 3),
                "format_s": round(format_s, 3),
                "model_load_s": round(load_s, 3),
                "data_load_s": round(data_load_s, 3),
                "recoverable_s_per_launch": round(recoverable_s, 3),
            },
        )
