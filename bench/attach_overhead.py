"""What ``gpudoctor attach`` costs the patient: step throughput of the healthy probe, bare vs attached.

Each pair is one bare and one attached run of ``probes/healthy.py --seconds S``;
the attached side alternates between pairs, and the script prints each pair's
throughputs and attached/bare ratio, then their median and geometric mean
(with its standard error: on a shared box the run-to-run noise is several
percent) and, as the last line, ``COST_PCT=<float>`` (1 - geometric mean, in %).

``--mode concurrent`` (default) runs the two sides of a pair at the same time,
so a change in machine load (other jobs on a shared box) hits both alike;
the doctor's own CPU use is then shared by both sides, and is printed
separately. ``--mode sequential`` runs them one after the other (ABBA order),
which is the cleaner measure on a quiet machine with a core to spare.

The doctor attaches once the probe has finished starting (a warm-up bare run
measures ``startup_s``; ``--settle`` seconds more), so the debugger stop, the
hook install and the detach all fall inside the measured training window; it
stays until the probe exits. The probe reports ``STEPS_PER_S`` over its steps
after a warm-up. Usage::

    python bench/attach_overhead.py --seconds 40 --pairs 6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "probes" / "healthy.py"
STEPS = re.compile(r"STEPS_PER_S=([0-9.]+)")


class Probe:
    def __init__(self, seconds: float, truth: Path) -> None:
        self.truth = truth
        self.proc = subprocess.Popen([sys.executable, str(PROBE), "--seconds", str(seconds), "--truth", str(truth)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def steps_per_s(self) -> float:
        out, err = self.proc.communicate()
        found = STEPS.findall(out)
        if self.proc.returncode != 0 or not found:
            raise RuntimeError(f"the probe failed (exit {self.proc.returncode}): {err[-500:]}")
        return float(found[-1])


def doctor(pid: int, out: Path, doctor_args: list[str]) -> float:
    """Attach until the probe exits; returns the doctor's CPU seconds (with py-spy and gdb)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = os.times()
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "attach", str(pid), "--out", str(out), *doctor_args],
                          capture_output=True, text=True, env=env)
    after = os.times()
    if done.returncode != 0:
        print(f"  doctor exit {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return (after.children_user + after.children_system) - (before.children_user + before.children_system)


def pair(i: int, args: argparse.Namespace, attach_after_s: float, tmp: Path) -> tuple[float, float, float]:
    """(bare steps/s, attached steps/s, doctor CPU s) of pair ``i``."""
    attached_first = i % 2 == 1
    if args.mode == "concurrent":
        probes = [Probe(args.seconds, tmp / f"truth-{i}-{k}.json") for k in range(2)]
        patient, bare = (probes[0], probes[1]) if attached_first else (probes[1], probes[0])
        time.sleep(attach_after_s)
        cpu = doctor(patient.proc.pid, tmp / f"run-{i}", args.doctor_args)
        return bare.steps_per_s(), patient.steps_per_s(), cpu
    results: dict[str, float] = {}
    for kind in (("attached", "bare") if attached_first else ("bare", "attached")):
        probe = Probe(args.seconds, tmp / f"truth-{i}-{kind}.json")
        if kind == "attached":
            time.sleep(attach_after_s)
            results["cpu"] = doctor(probe.proc.pid, tmp / f"run-{i}", args.doctor_args)
        results[kind] = probe.steps_per_s()
    return results["bare"], results["attached"], results["cpu"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=40.0, help="training seconds per run (default 40)")
    p.add_argument("--pairs", type=int, default=6, help="bare/attached pairs (default 6)")
    p.add_argument("--mode", choices=("concurrent", "sequential"), default="concurrent")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after startup before attaching")
    p.add_argument("doctor_args", nargs="*", help="extra 'gpudoctor attach' options, after --")
    args = p.parse_args(argv)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="gpudoctor-bench-") as name:
        tmp = Path(name)
        warm = Probe(3.0, tmp / "truth-warmup.json")
        warm.steps_per_s()
        attach_after_s = float(json.loads(warm.truth.read_text())["startup_s"]) + args.settle
        for i in range(args.pairs):
            bare, attached, cpu = pair(i, args, attach_after_s, tmp)
            ratios.append(attached / bare)
            print(f"pair {i + 1}: bare {bare:.3f} steps/s, attached {attached:.3f} steps/s, "
                  f"ratio {attached / bare:.4f}, doctor CPU {cpu:.2f} s", flush=True)
    logs = [math.log(r) for r in ratios]
    mean = math.exp(statistics.fmean(logs))
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    print(f"{args.mode}: {len(ratios)} pairs of {args.seconds:g} s; attached/bare median {statistics.median(ratios):.4f}, "
          f"geometric mean {mean:.4f} ± {se:.4f} (standard error), min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"COST_PCT={100 * (1 - mean):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
