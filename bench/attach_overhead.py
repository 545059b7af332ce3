"""What ``gpudoctor attach`` costs the patient: step throughput of the healthy probe, bare vs attached.

``--mode interleaved`` (default) runs ONE long patient and alternates bare and
attached blocks on it: bare, attached, bare, attached, ..., bare. Each attached
block is one whole ``gpudoctor attach PID --duration D`` session, from the
doctor's launch to its exit: the doctor's own start-up, the debugger stop, the
hook install, py-spy and the samplers, the detach and the report writing all
fall inside it. Each bare block that follows lasts as long as the attached
block before it. The probe logs each step's end time and batch width
(``--step-log``); a block's speed is the seconds its steps take in a typical
bare block (the median per batch width) over the seconds they took, so a block
that drew long batches is not mistaken for a slow one. Each attached block is
compared with the mean of the bare blocks either side of it, so a slow drift
of the machine cancels; comparing blocks of one process also removes the
run-to-run spread of separate processes (18-21% between bare runs on the
2-core box this was built on), which no number of separate runs averages away
cheaply.

``--mode sequential`` runs separate bare and attached processes in ABBA order,
attaching right after start-up and staying until exit (the cost of a session
that covers a whole run, start-up included, but noisier for the reason above).

Output: one line per attached block (or pair), then the median and geometric
mean of attached/bare (with its standard error), and as the last line
``COST_PCT=<float>`` (1 - geometric mean, in %). Usage::

    python bench/attach_overhead.py                       # interleaved, 6 attached blocks of 20 s
    python bench/attach_overhead.py --blocks 8 --duration 30
    python bench/attach_overhead.py --mode sequential --seconds 40 --pairs 6
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
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "probes" / "healthy.py"
STEPS = re.compile(r"STEPS_PER_S=([0-9.]+)")


class Probe:
    def __init__(self, seconds: float, truth: Path, step_log: Path | None = None) -> None:
        self.truth = truth
        argv = [sys.executable, str(PROBE), "--seconds", str(seconds), "--truth", str(truth)]
        if step_log is not None:
            argv += ["--step-log", str(step_log)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def steps_per_s(self) -> float:
        out, err = self.proc.communicate()
        found = STEPS.findall(out)
        if self.proc.returncode != 0 or not found:
            raise RuntimeError(f"the probe failed (exit {self.proc.returncode}): {err[-500:]}")
        return float(found[-1])


def doctor(pid: int, out: Path, doctor_args: list[str]) -> float:
    """One attach session (until ``doctor_args`` or the probe ends it); returns the doctor's CPU seconds."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = os.times()
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "attach", str(pid), "--out", str(out), *doctor_args],
                          capture_output=True, text=True, env=env)
    after = os.times()
    if done.returncode != 0:
        print(f"  doctor exit {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return (after.children_user + after.children_system) - (before.children_user + before.children_system)


def startup_s(tmp: Path) -> float:
    """The healthy probe's start-up here, from a short warm-up run (which also fills its tokenizer cache)."""
    warm = Probe(3.0, tmp / "truth-warmup.json")
    warm.steps_per_s()
    return float(json.loads(warm.truth.read_text())["startup_s"])


@dataclass
class Step:
    end: float  # wall clock
    seconds: float  # since the previous step ended: data wait + compute
    width: int  # padded tokens in its batch: the healthy probe's batches differ ~10x in work


def read_steps(log: Path) -> list[Step]:
    rows = [line.split() for line in log.read_text().splitlines()]
    rows = [r for r in rows if len(r) == 3]  # the probe may be stopped mid-line
    return [Step(float(b[0]), float(b[0]) - float(a[0]), int(b[2]) - int(a[2])) for a, b in pairwise(rows)]


def typical_seconds(steps: list[Step], bare: list[tuple[float, float]]) -> dict[int, float]:
    """Median bare duration of a step, per batch width."""
    by_width: dict[int, list[float]] = {}
    for step in steps:
        if any(t0 <= step.end <= t1 for t0, t1 in bare):
            by_width.setdefault(step.width, []).append(step.seconds)
    return {w: statistics.median(v) for w, v in by_width.items()}


def block_speed(steps: list[Step], typical: dict[int, float], t0: float, t1: float) -> float:
    """Typical seconds of the block's steps over the seconds they took: 1.0 is an ordinary bare block.

    Steps/s alone would swing ±15% between blocks with the batch mix (widths 20 to
    256 tokens); weighting each step by what a bare step of its width takes removes that.
    """
    inside = [s for s in steps if t0 <= s.end - s.seconds and s.end <= t1 and s.width in typical]
    if len(inside) < 10:
        raise RuntimeError(f"only {len(inside)} steps fell in a {t1 - t0:.1f} s block: the patient stopped "
                           "stepping (see its run folders), or the blocks are too short")
    return sum(typical[s.width] for s in inside) / sum(s.seconds for s in inside)


def interleaved(args: argparse.Namespace, tmp: Path) -> list[float]:
    settle = startup_s(tmp) + args.settle
    # a generous budget: the probe is stopped early once the last bare block is over
    budget = settle + (2 * args.blocks + 1) * (args.duration + 15.0) + 30.0
    log = tmp / "steps.log"
    patient = Probe(budget, tmp / "truth-patient.json", step_log=log)
    time.sleep(settle)
    blocks: list[tuple[str, float, float]] = []

    def bare(length: float) -> None:
        t0 = time.time()
        time.sleep(length)
        blocks.append(("bare", t0, time.time()))

    bare(args.duration)
    for i in range(args.blocks):
        t0 = time.time()
        cpu = doctor(patient.proc.pid, tmp / f"run-{i}", ["--duration", str(args.duration), *args.doctor_args])
        t1 = time.time()
        blocks.append(("attached", t0, t1))
        print(f"  attached block {i + 1}: {t1 - t0:.1f} s, doctor CPU {cpu:.2f} s; {taken(tmp / f'run-{i}')}",
              flush=True)
        bare(t1 - t0)
    patient.proc.terminate()  # the step log is written a line per step, so nothing is lost
    patient.proc.communicate()
    return ratios_from_blocks(blocks, read_steps(log))


def taken(folder: Path) -> str:
    """What the session took from the patient's own threads, as the doctor recorded it."""
    try:
        target = json.loads((folder / "meta.json").read_text())["attach"]["targets"][0]
    except (OSError, KeyError, IndexError, json.JSONDecodeError):
        return "no attach record"
    ms = {k: 1000 * target[k] for k in ("gdb_s", "install_s", "uninstall_s") if target.get(k) is not None}
    return ", ".join(f"{k.removesuffix('_s')} {v:.0f} ms" for k, v in ms.items()) + \
        " (gdb: its whole run; the patient is stopped for part of it)"


def ratios_from_blocks(blocks: list[tuple[str, float, float]], steps: list[Step]) -> list[float]:
    typical = typical_seconds(steps, [(t0, t1) for kind, t0, t1 in blocks if kind == "bare"])
    rates = [(kind, block_speed(steps, typical, t0, t1)) for kind, t0, t1 in blocks]
    ratios = []
    for i, (kind, rate) in enumerate(rates):
        if kind != "attached":
            continue
        around = statistics.fmean([rates[i - 1][1], rates[i + 1][1]])
        ratios.append(rate / around)
        print(f"block {len(ratios)}: speed bare before {rates[i - 1][1]:.4f}, attached {rate:.4f}, "
              f"bare after {rates[i + 1][1]:.4f}; ratio {rate / around:.4f}", flush=True)
    return ratios


def sequential(args: argparse.Namespace, tmp: Path) -> list[float]:
    attach_after_s = startup_s(tmp) + args.settle
    ratios = []
    for i in range(args.pairs):
        results: dict[str, float] = {}
        for kind in (("attached", "bare") if i % 2 else ("bare", "attached")):
            probe = Probe(args.seconds, tmp / f"truth-{i}-{kind}.json")
            if kind == "attached":
                time.sleep(attach_after_s)
                results["cpu"] = doctor(probe.proc.pid, tmp / f"run-{i}", args.doctor_args)
            results[kind] = probe.steps_per_s()
        ratios.append(results["attached"] / results["bare"])
        print(f"pair {i + 1}: bare {results['bare']:.3f} steps/s, attached {results['attached']:.3f} steps/s, "
              f"ratio {ratios[-1]:.4f}, doctor CPU {results['cpu']:.2f} s", flush=True)
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("interleaved", "sequential"), default="interleaved")
    p.add_argument("--blocks", type=int, default=6, help="interleaved: attached blocks (default 6)")
    p.add_argument("--duration", type=float, default=20.0, help="interleaved: seconds per attach session (default 20)")
    p.add_argument("--seconds", type=float, default=40.0, help="sequential: training seconds per run (default 40)")
    p.add_argument("--pairs", type=int, default=6, help="sequential: bare/attached pairs (default 6)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after start-up before the first block")
    p.add_argument("doctor_args", nargs="*", help="extra 'gpudoctor attach' options, after --")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpudoctor-bench-") as name:
        ratios = (interleaved if args.mode == "interleaved" else sequential)(args, Path(name))
    logs = [math.log(r) for r in ratios]
    mean = math.exp(statistics.fmean(logs))
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    print(f"{args.mode}: {len(ratios)} comparisons; attached/bare median {statistics.median(ratios):.4f}, "
          f"geometric mean {mean:.4f} ± {se:.4f} (standard error), min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"COST_PCT={100 * (1 - mean):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
