"""How often the doctor wakes, and what it takes, beside a patient that keeps every core busy.

On a saturated host the doctor's cost is less its CPU seconds than its wakes: each
one preempts a training thread (at idle priority too: an idle-class thread still
gets its small share), and a preempted thread of torch's pool leaves its peers
spinning at the next barrier. Timing ratios resolve ~1% only over many blocks
(``saturated_overhead.py``); these counts come from the kernel and resolve a single
wake. Per thread of the doctor and of the patient, from ``/proc/<pid>/task/*``:
CPU seconds a minute (``schedstat``), voluntary wakes a second and involuntary
switches a second (a thread preempted). Printed: the table, the doctor's wakes a
second in all, and the patient's preemptions a second with the doctor over the
same patient's bare (one run: the bare window first, then attached or under run).

    python bench/doctor_wakes.py --mode attach --seconds 30
    python bench/doctor_wakes.py --mode run --seconds 30
    python bench/doctor_wakes.py --mode run --patient workers --seconds 30   # the patient's workers counted too

Measure on a quiet host: anything else running preempts the patient too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from saturated_overhead import patient_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "probes" / "healthy.py"
Counts = dict[str, tuple[float, int, int]]  # thread -> (CPU s, voluntary, involuntary)


def threads(pid: int) -> Counts:
    out: Counts = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            run_ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
        except OSError:
            continue
        vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[f"{name}:{task.name}"] = (run_ns / 1e9, vol, invol)
    return out


def tree_threads(pid: int, skip: int | None = None) -> Counts:
    """The threads of ``pid`` and its descendants, less the subtree under ``skip``."""
    out = threads(pid)
    try:
        kids = psutil.Process(pid).children(recursive=True)
        skipped = {skip} | {k.pid for k in psutil.Process(skip).children(recursive=True)} if skip else set()
    except psutil.Error:
        return out
    for child in kids:
        if child.pid not in skipped:
            out.update({f"{child.pid}/{k}": v for k, v in threads(child.pid).items()})
    return out


def rates(before: Counts, after: Counts, seconds: float) -> dict[str, tuple[float, float, float]]:
    """thread -> (CPU s a minute, voluntary a second, involuntary a second) over the window."""
    out = {}
    for name, (cpu, vol, invol) in after.items():
        c0, v0, i0 = before.get(name, (0.0, 0, 0))
        out[name] = ((cpu - c0) * 60 / seconds, (vol - v0) / seconds, (invol - i0) / seconds)
    return out


def window(read: Callable[[], Counts], seconds: float) -> dict[str, tuple[float, float, float]]:
    before = read()
    time.sleep(seconds)
    return rates(before, read(), seconds)


def preemptions(patient: dict[str, tuple[float, float, float]]) -> float:
    """Involuntary switches a second of the patient's busy threads (those over a second of CPU a minute)."""
    return sum(i for c, _, i in patient.values() if c > 1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("attach", "run"), default="attach")
    p.add_argument("--seconds", type=float, default=30.0, help="each measured window (default 30)")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before a window (default 15)")
    p.add_argument("--patient", choices=("threads", "workers", "both"), default="threads",
                   help="how the patient fills the cores, as in saturated_overhead.py (default threads)")
    p.add_argument("--worker-ms", type=float, default=40.0, help="CPU ms per batch in a worker (default 40)")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    tmp = Path(tempfile.mkdtemp(prefix="doctor-wakes-"))
    cores = os.cpu_count() or 1
    pargs = patient_args(args.patient, cores, args.worker_ms)
    probe = [sys.executable, str(PROBE), *pargs]
    total = 2 * (args.settle + args.seconds) + 30

    bare = subprocess.Popen([*probe, "--seconds", str(total)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(args.settle)
    bare_rates = window(lambda: tree_threads(bare.pid), args.seconds)
    if args.mode == "attach":
        doctor = subprocess.Popen([sys.executable, "-m", "gpudoctor", "attach", str(bare.pid), "--out",
                                   str(tmp / "attach"), "--duration", str(args.settle + args.seconds + 5)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        patient_pid = bare.pid
    else:
        bare.terminate()
        bare.wait()
        doctor = subprocess.Popen([sys.executable, "-m", "gpudoctor", "run", "--out", str(tmp / "run"), "--",
                                   *probe, "--seconds", str(args.settle + args.seconds + 5)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(3)
        kids = psutil.Process(doctor.pid).children()
        if not kids:
            raise SystemExit("gpudoctor run started no child")
        patient_pid = kids[0].pid
    time.sleep(args.settle)
    both = window(lambda: {**{f"doctor {k}": v for k, v in tree_threads(doctor.pid, skip=patient_pid).items()},
                           **{f"patient {k}": v for k, v in tree_threads(patient_pid).items()}}, args.seconds)
    doctor.wait()
    bare.terminate()
    bare.wait()

    print(f"{args.mode}, healthy probe {' '.join(pargs)} on {cores} cores; windows of {args.seconds:g} s")
    print(f"{'thread':44s} {'CPU s/min':>9s} {'wakes/s':>8s} {'preempted/s':>11s}")
    for name, (cpu, vol, invol) in sorted(both.items()):
        if cpu > 0 or vol > 0:
            print(f"{name:44s} {cpu:9.4f} {vol:8.1f} {invol:11.1f}")
    doctor_rows = [v for k, v in both.items() if k.startswith("doctor ")]
    patient_rows = {k: v for k, v in both.items() if k.startswith("patient ")}
    ours = {k: v for k, v in patient_rows.items() if "gd-" in k}  # the event writer (and attach's watchdog)
    print(f"doctor: {sum(v[1] for v in doctor_rows):.1f} wakes/s, {sum(v[0] for v in doctor_rows):.3f} CPU s/min; "
          f"in the patient (event writer, watchdog): {sum(v[1] for v in ours.values()):.1f} wakes/s, "
          f"{sum(v[0] for v in ours.values()):.3f} CPU s/min")
    with_doctor, alone = preemptions(patient_rows), preemptions(bare_rates)
    print(f"patient's busy threads preempted {with_doctor:.1f}/s with the doctor, {alone:.1f}/s bare: "
          f"ratio {with_doctor / alone if alone else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
