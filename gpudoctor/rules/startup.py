"""Time before the first training step: idle GPUs while the CPU formats data."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.model import time_mean
from gpudoctor.core.thresholds import WASTE_SHARE, percent
from gpudoctor.rules.account import claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct

LONG_STARTUP_S = 60.0
CPU_BOUND_CORES = 0.8  # a map that keeps most of a core busy is limited by the CPU


@dataclass(frozen=True)
class StartupFigures:
    """What the time before the first step went to, and the map's process count: worded by ``_word``."""

    startup_s: float
    wall_s: float
    recoverable_s: float  # preparing the data (formatting or tokenizing): what doing it once gives back
    format_s: float
    model_load_s: float
    data_load_s: float
    imports_s: float
    other_s: float
    top_maps: tuple[tuple[str, float], ...]  # the formatting spans that took longest: (name, seconds)
    cores: int
    used: float | None  # cores the map kept busy; None: not measured
    others: float  # cores other programs kept busy meanwhile
    parallel: int | None  # num_proc for the map; None: more processes would not help
    gpu_seen: bool
    map_cache: tuple[str, ...]  # what the datasets cache did for each map: "hit", "miss", "none"


class StartupIdle(Rule):
    name = "startup_idle"
    fires_when = (f"data formatting or tokenizing before the first step is ≥ {percent(WASTE_SHARE)} of wall "
                  f"or ≥ {LONG_STARTUP_S:g} s")
    fix_from = 'do it once before renting: `datasets.map(batched=True)` + `save_to_disk`; `num_proc` only when the measured map kept a core busy and cores were idle; $ per launch'

    def match(self, a: Analysis) -> Finding | None:
        fig = _figures(a)
        return _word(fig) if fig is not None else None


def _figures(a: Analysis) -> StartupFigures | None:
    p = a.primary
    if p is None:
        return None
    startup_s = p.seconds("startup")
    if startup_s <= 0:
        return None
    first = p.first_step if p.first_step is not None else p.end
    before = {c: tl.total(tl.clip(tl.merge(s), p.start, first)) for c, s in p.spans.items()}
    format_s = before.get("format", 0.0)
    in_loop_s = p.host_tokenize_in_loop_s if p.host_tokenize_in_loop_s is not None else p.tokenize_in_loop_s
    tok_s = p.tokenize_s - in_loop_s  # before the loop (the host's own in-loop figure on a GPU run)
    recoverable_s = max(format_s, tok_s)
    if recoverable_s / p.wall_s < WASTE_SHARE and recoverable_s < LONG_STARTUP_S:
        return None
    parts = p.startup_parts()
    top = sorted(p.span_names.get("format", {}).items(), key=lambda kv: -kv[1])[:3]
    cores = a.host.cores or 1
    used, others = _cores_during(a, tl.clip(tl.merge(p.spans.get("format", [])), p.start, first))
    return StartupFigures(
        startup_s=startup_s, wall_s=p.wall_s, recoverable_s=recoverable_s, format_s=format_s,
        model_load_s=before.get("model_load", 0.0), data_load_s=before.get("data_load", 0.0),
        imports_s=parts["imports_s"], other_s=parts["other_s"], top_maps=tuple(top), cores=cores,
        used=used, others=others, parallel=_parallel_map(used, others, cores),
        gpu_seen=a.gpu.count > 0 or a.gpu.busy_fraction is not None, map_cache=tuple(p.map_cache))


def _word(fig: StartupFigures) -> Finding:
    what = ", ".join(f"{n} {s:.1f} s" for n, s in fig.top_maps) or "tokenizer calls"
    parallel, used = fig.parallel, fig.used
    map_args: dict[str, object] = {"batched": True}
    if parallel:
        map_args["num_proc"] = parallel
        why = (f"it kept {used:.1f} {_cores(used)} busy, so {parallel} processes split it" if used is not None
               else f"{parallel} processes split it")
    elif used is not None:
        why = (f"it kept only {used:.1f} {_cores(used)} busy (not CPU-bound: more processes would wait too)"
               if used < CPU_BOUND_CORES else
               f"other programs kept {fig.others:.1f} of {fig.cores} cores busy: more processes would compete")
    else:
        why = "its CPU use was not measured, so no process count is proposed"
    num_proc = f", num_proc={parallel}" if parallel else ""
    return Finding(
        rule=StartupIdle.name,
        title=("GPUs idle" if fig.gpu_seen else "Training waits") + " while the data is prepared",
        claims=[claim("startup", fig.recoverable_s, fig.startup_s)],
        per_launch_s=fig.recoverable_s,
        evidence=(
            f"The first step started {fig.startup_s:.1f} s after launch ({pct(fig.startup_s / fig.wall_s)} of wall): "
            f"{fig.recoverable_s:.1f} s preparing data ({what}), {fig.data_load_s:.1f} s loading the dataset, "
            f"{fig.model_load_s:.1f} s loading the model, {fig.imports_s:.1f} s importing libraries, "
            f"{fig.other_s:.1f} s in other setup (building the model, the script's own)."
        ),
        fix=Fix(
            summary=("Format and tokenize once before " + ("the GPUs are rented" if fig.gpu_seen else "training")
                     + ", save with save_to_disk, and only load_from_disk in the training script"
                     + f" (the map: batched{num_proc}; {why})."
                     + _cache_text(list(fig.map_cache))),
            config=map_args,
            snippet=(
                "# prepare_data.py: run once, before training\n"
                f"ds = ds.map(format_fn, batched=True{num_proc})\n"
                "ds.save_to_disk('data/formatted')\n"
                "# train.py\n"
                "ds = datasets.load_from_disk('data/formatted')"
            ),
            library="datasets.Dataset.map",
            call="ds.map",
        ),
        data={
            "startup_s": round(fig.startup_s, 3),
            "format_s": round(fig.format_s, 3),
            "model_load_s": round(fig.model_load_s, 3),
            "data_load_s": round(fig.data_load_s, 3),
            "imports_s": round(fig.imports_s, 3),
            "recoverable_s_per_launch": round(fig.recoverable_s, 3),
            "prep_cores_used": round(used, 2) if used is not None else None,
        },
    )


def _cores_during(a: Analysis, spans: list[tuple[float, float]]) -> tuple[float | None, float]:
    """(cores the run kept busy, cores other programs kept busy) in the host samples inside ``spans``."""
    rows = [r for r in a.rec.host if any(lo <= r.get("t", -1.0) <= hi for lo, hi in spans)]
    run_pct = time_mean(rows, "cpu_proc_pct")
    if run_pct is None:
        return None, 0.0
    used = run_pct / 100.0
    total_pct = time_mean(rows, "cpu_total_pct")
    total = total_pct / 100.0 * (a.host.cores or 1) if total_pct is not None else used
    return used, max(0.0, total - used)


def _parallel_map(used: float | None, others: float, cores: int) -> int | None:
    """``num_proc`` for the map only when it was CPU-bound and idle cores would take a share."""
    if used is None or used < CPU_BOUND_CORES:
        return None
    free = int(cores - others + 0.25)
    return free if free >= 2 else None


def _cache_text(states: list[str]) -> str:
    """What the datasets cache does for the next launch, from what this one's maps saw."""
    if not states:
        return ""
    if all(s == "hit" for s in states):
        return (" This launch's maps were read from the datasets cache: the time left is loading "
                "and the rest of the setup, not the maps.")
    if "none" in states:
        return (" The dataset is built in memory, so datasets never caches its map: every launch "
                "pays it again until it is saved once.")
    return (" The datasets cache now holds these maps' results: the next launch with the same "
            "data and function reads them (a one-time cost), save_to_disk makes that explicit.")


def _cores(used: float) -> str:
    return "core" if f"{used:.1f}" == "1.0" else "cores"
