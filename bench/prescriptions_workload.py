"""Predicted vs achieved for the workload-model fixes: padding (``max_length``) and a loop's saves.

For each probe: run it under ``gpudoctor run``, take the finding's one value and the speedup of
steady-state steps/s that ``gpudoctor try`` predicts for it (:func:`gpudoctor.tryfix.steady.predict`,
the same function), then apply the value through the probe's own flag and measure before and
after interleaved (baseline, fixed, baseline, fixed, ...; the order flips every pair so drift in
the machine's load hits both alike). Steady state: each run's step times with the first
max(3, 10%) dropped. Prints predicted vs achieved, each pair's ratio and their spread.
Target: achieved within ±20% of predicted.

    python bench/prescriptions_workload.py --pairs 3             # both probes
    python bench/prescriptions_workload.py --probe narrow_padding --pairs 5

Entries for the lead's ``bench/prescriptions.py``: :data:`ENTRIES` (probe, base flags, the flag
the fix sets, the rule, and how to read the finding's value).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Entry:
    probe: str
    rule: str
    flag: str
    base: tuple[str, ...]
    value: Callable[[dict[str, Any]], int]  # the finding's value for ``flag``
    steps: Callable[[int], int]  # optimizer steps of each measured run, from the value


ENTRIES = {
    "narrow_padding": Entry("narrow_padding", "padding_waste", "--max-length", ("--max-length", "1024"),
                            lambda f: int(f["data"]["new_max_length"]), lambda v: 12),
    "fsync_checkpoints": Entry("fsync_checkpoints", "checkpoint_overhead", "--save-every", ("--save-every", "1"),
                               lambda f: int(f["fix"]["config"]["save_steps"]), lambda v: max(40, v + 10)),
}


def steady_steps_per_s(step_times: list[float]) -> float:
    warm = max(3, math.ceil(0.1 * len(step_times)))
    kept = step_times[warm:]
    return len(kept) / sum(kept)


def probe_cmd(entry: Entry, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "probes" / f"{entry.probe}.py"), *entry.base, *extra]


def run_probe(cmd: list[str], truth: Path) -> tuple[float, float]:
    """(steady steps/s of wall time, steady steps per CPU second): the second is the work per step
    itself, which time-slicing on a shared machine does not stretch."""
    subprocess.run([*cmd, "--truth", str(truth)], check=True, cwd=ROOT, capture_output=True)
    t = json.loads(truth.read_text())
    return steady_steps_per_s(t["step_times_s"]), steady_steps_per_s(t["step_cpu_s"])


def doctor(entry: Entry, tmp: Path, steps: int) -> tuple[int, float | None, str]:
    """(the finding's value, try's predicted speedup of steps/s, its basis) from one recording."""
    from gpudoctor.analysis import analyze
    from gpudoctor.recording.store import load_recording
    from gpudoctor.tryfix import steady

    out = tmp / f"run-{entry.probe}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "gpudoctor", "run", "--out", str(out), "--",
                    *probe_cmd(entry, "--steps", str(steps))], check=True, cwd=ROOT, env=env, capture_output=True)
    report = json.loads((out / "report.json").read_text())
    finding = next((f for f in report["findings"] if f["rule"] == entry.rule), None)
    if finding is None:
        raise SystemExit(f"{entry.probe}: no {entry.rule} finding (found {[f['rule'] for f in report['findings']]})")
    prediction = steady.predict(analyze(load_recording(out)), entry.rule, None)
    return entry.value(finding), prediction.speedup, prediction.basis


def bench(entry: Entry, pairs: int, tmp: Path) -> dict[str, Any]:
    value, predicted, basis = doctor(entry, tmp, entry.steps(0))
    steps = ("--steps", str(entry.steps(value)))
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for i in range(pairs):
        rates: dict[str, tuple[float, float]] = {}
        for which in (("base", "fixed") if i % 2 == 0 else ("fixed", "base")):
            extra = (entry.flag, str(value)) if which == "fixed" else ()
            rates[which] = run_probe(probe_cmd(entry, *steps, *extra), tmp / f"truth-{entry.probe}-{i}-{which}.json")
        ratios.append(rates["fixed"][0] / rates["base"][0])
        cpu_ratios.append(rates["fixed"][1] / rates["base"][1])
        print(f"  {entry.probe} pair {i + 1}: base {rates['base'][0]:.3f} steps/s, {entry.flag} {value} "
              f"{rates['fixed'][0]:.3f} steps/s: {ratios[-1]:.2f}x (per CPU second: {cpu_ratios[-1]:.2f}x)", flush=True)
    achieved = statistics.median(ratios)
    error = achieved / predicted - 1 if predicted else None
    return {"probe": entry.probe, "value": f"{entry.flag} {value}", "predicted": predicted, "basis": basis,
            "achieved_median": achieved, "achieved_min": min(ratios), "achieved_max": max(ratios),
            "cpu_median": statistics.median(cpu_ratios), "cpu_min": min(cpu_ratios), "cpu_max": max(cpu_ratios),
            "error": error, "within_20pct": error is not None and abs(error) <= 0.2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--probe", choices=[*ENTRIES, "all"], default="all")
    args = ap.parse_args()
    chosen = list(ENTRIES.values()) if args.probe == "all" else [ENTRIES[args.probe]]
    with tempfile.TemporaryDirectory(prefix="gpudoctor-prescriptions-") as tmp:
        for entry in chosen:
            r = bench(entry, args.pairs, Path(tmp))
            err = f"{r['error']:+.0%}" if r["error"] is not None else "n/a"
            print(f"{r['probe']}: {r['value']}: predicted {r['predicted']:.2f}x, achieved {r['achieved_median']:.2f}x "
                  f"(pairs {r['achieved_min']:.2f}-{r['achieved_max']:.2f}), error {err}"
                  f" {'OK' if r['within_20pct'] else 'OUTSIDE ±20%'}; steps per CPU second {r['cpu_median']:.2f}x "
                  f"({r['cpu_min']:.2f}-{r['cpu_max']:.2f})", flush=True)


if __name__ == "__main__":
    main()
