"""What the doctor costs a patient that keeps every core busy (issue 16): the hard case.

``bench/attach_overhead.py`` and ``bench/run_overhead.py`` use the healthy probe
with one torch thread, which leaves a core free for the doctor on a 2-core box.
Here the patient saturates the cores (``--patient``):

* ``threads``: torch intra-op threads = cores;
* ``workers``: one torch thread, DataLoader workers = cores, each batch costing
  ``--worker-ms`` of CPU in a worker (a data-bound pipeline: the workers set the pace);
* ``both``: the two together (oversubscribed).

``--mode attach``: ONE long patient, bare and attached blocks interleaved
(bare, attached, bare, ...), each attached block one whole ``gpudoctor attach
--duration S`` session. Each session is split by its own meta.json: from the
doctor's launch to the hooks' install plus ``--settle-hooked`` seconds (gdb, the
install) and from the detach to the doctor's exit (detach, report) are the
*one-time* cost, stated in seconds of the patient's work lost; between them is
the *steady state*, compared with the bare blocks either side (speed weighted by
each step's batch width, as in attach_overhead.py).

``--mode run``: ONE long patient under ``gpudoctor run``, bare and profiled
slots of ``--seconds`` interleaved: in a bare slot the patient's hooks are
removed (the probe's ``--toggle-hooks``: SIGUSR1 runs ``hooks.uninstall()``,
SIGUSR2 installs them again) and the doctor's process is stopped (SIGSTOP), so
nothing of run's is left but memory; each profiled slot is compared with the
bare slots either side, as above. Two separate processes cannot resolve 1% here
(bare runs of the same fixed work differ by up to 20% on this VM; A/A pairs of
processes gave means from 0.918 to 1.146), one process can. The one-time costs
are the doctor's start-up (launch to first step, over a bare launch's, each
alone) and its report after the patient's last step. ``--control`` never
switches run's parts back on, and gives every slot the same switch-off (with
``--refork``, a new pass over the data): an A/A test, the design's floor. ``--refork``
(with workers): the switch reaches the probe's main process only and ends the
pass over the data, so the next pass forks workers that inherit the hooks or
their absence, as a run's workers do, instead of installing hooks in a worker.

Both print the geometric mean of profiled/bare over the blocks with its standard
error, and the doctor's CPU seconds per minute by part (meta.json
``doctor_cpu_s``: samplers, py-spy, its stacks thread, the live view, gdb), the
event writer's thread in the patient (its ``exit``/``detach`` event) and the
hooks (the patient's main-thread CPU per step over a bare step's). Usage::

    python bench/saturated_overhead.py --mode attach --patient threads --blocks 8 --seconds 30
    python bench/saturated_overhead.py --mode run --patient threads --blocks 8 --seconds 15
    python bench/saturated_overhead.py --mode run --patient threads --blocks 8 --seconds 15 --control
    python bench/saturated_overhead.py --mode attach --patient workers --blocks 2 --seconds 5   # smoke

Numbers taken while anything else runs on the machine are noise: measure on a quiet host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_overhead import Step, read_steps, startup_s, typical_seconds  # noqa: E402

PROBE = ROOT / "probes" / "healthy.py"
PARTS = ("samplers", "py_spy", "stacks_thread", "live_view", "gdb_and_other_children", "main_thread", "process")


def patient_args(kind: str, cores: int, worker_ms: float) -> list[str]:
    threads = cores if kind in ("threads", "both") else 1
    args = ["--threads", str(threads)]
    if kind in ("workers", "both"):
        args += ["--workers", str(cores), "--worker-ms", str(worker_ms)]
    return args


def doctor_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


# -- per-block figures ---------------------------------------------------------------------
def speed(steps: list[Step], typical: dict[int, float], t0: float, t1: float, min_steps: int = 3) -> float | None:
    """Typical seconds of the steps inside [t0, t1] over the seconds they took (1.0: a bare block)."""
    inside = [s for s in steps if t0 <= s.end - s.seconds and s.end <= t1 and s.width in typical]
    if len(inside) < min_steps:
        return None
    return sum(typical[s.width] for s in inside) / sum(s.seconds for s in inside)


def cpu_rows(log: Path) -> list[tuple[float, float, int]]:
    """(wall end, main-thread CPU end, padded tokens so far) per step, from the probe's step log."""
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(float(r[0]), float(r[1]), int(r[2])) for r in rows if len(r) == 3]


def cpu_per_width(rows: list[tuple[float, float, int]], spans: list[tuple[float, float]]) -> dict[int, float]:
    """Median main-thread CPU of a step, per batch width, over the steps that ended inside ``spans``."""
    per: dict[int, list[float]] = {}
    for end, cpu, width in _cpu_steps(rows):
        if any(a <= end <= b for a, b in spans):
            per.setdefault(width, []).append(cpu)
    return {w: statistics.median(v) for w, v in per.items()}


def extra_cpu_s(rows: list[tuple[float, float, int]], typical: dict[int, float],
                spans: list[tuple[float, float]]) -> float | None:
    """Main-thread CPU the steps inside ``spans`` took beyond a typical bare step of their width: the hooks."""
    inside = [(cpu, typical[w]) for end, cpu, w in _cpu_steps(rows)
              if any(a <= end <= b for a, b in spans) and w in typical]
    return sum(c - t for c, t in inside) if inside else None


def _cpu_steps(rows: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    return [(b[0], b[1] - a[1], b[2] - a[2]) for a, b in zip(rows, rows[1:], strict=False)]


def session_times(folder: Path) -> dict[str, Any]:
    meta = json.loads((folder / "meta.json").read_text())
    target = (meta.get("attach", {}).get("targets") or [{}])[0]
    return {"installed_at": target.get("installed_at"), "detach_time": meta.get("detach_time"),
            "gdb_s": target.get("gdb_s"), "install_s": target.get("install_s"),
            "cpu": meta.get("doctor_cpu_s") or {}, "priority": meta.get("doctor_priority")}


def writer_cpu_s(folder: Path) -> float:
    """The patient's event-writer threads' CPU: each writer says its own in its exit or detach event."""
    total = 0.0
    for path in (folder / "events").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if '"writer_cpu_s"' in line:
                total += float(json.loads(line)["writer_cpu_s"])
    return total


# -- attach -----------------------------------------------------------------------------------
def attach_mode(args: argparse.Namespace, tmp: Path, pargs: list[str]) -> dict[str, Any]:
    settle = startup_s(tmp) + args.settle
    budget = settle + (2 * args.blocks + 1) * (args.seconds + 20.0) + 60.0
    log = tmp / "steps.log"
    patient = subprocess.Popen([sys.executable, str(PROBE), "--seconds", str(budget), "--truth",
                                str(tmp / "truth.json"), "--step-log", str(log), *pargs],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(settle)
    blocks: list[tuple[str, float, float, Path | None]] = []

    def bare(length: float) -> None:
        t0 = time.time()
        time.sleep(length)
        blocks.append(("bare", t0, time.time(), None))

    bare(args.seconds)
    for i in range(args.blocks):
        out = tmp / f"run-{i}"
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "gpudoctor", "attach", str(patient.pid), "--out", str(out),
                               "--duration", str(args.seconds), *args.doctor_args],
                              capture_output=True, text=True, env=doctor_env())
        t1 = time.time()
        if done.returncode != 0:
            print(f"  doctor exit {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
        blocks.append(("attached", t0, t1, out))
        bare(t1 - t0)
    patient.terminate()
    patient.communicate()
    steps, rows = read_steps(log), cpu_rows(log)
    bare_spans = [(t0, t1) for kind, t0, t1, _ in blocks if kind == "bare"]
    typical = typical_seconds(steps, bare_spans)
    typical_cpu = cpu_per_width(rows, bare_spans)
    res: dict[str, Any] = {"ratios": [], "one_time_s": [], "cpu_per_min": [], "priority": None}
    for i, (kind, t0, t1, out) in enumerate(blocks):
        if kind != "attached" or out is None:
            continue
        s = session_times(out)
        res["priority"] = s["priority"]
        around_v = [speed(steps, typical, b[1], b[2]) for b in (blocks[i - 1], blocks[i + 1])]
        around = statistics.fmean([v for v in around_v if v is not None] or [float("nan")])
        hooked = s["installed_at"] is not None and s["detach_time"] is not None
        a = s["installed_at"] + args.settle_hooked if hooked else t0
        b = s["detach_time"] if hooked else t1
        steady = speed(steps, typical, a, b)
        if steady is None or math.isnan(around):
            print(f"block {len(res['ratios']) + 1}: too few steps to compare", flush=True)
            continue
        ratio = steady / around
        # one-time: the seconds of work lost before the steady state and after it
        lost = 0.0
        for c, d in ((t0, a), (b, t1)):
            v = speed(steps, typical, c, d, min_steps=1)
            lost += (d - c) * (1 - (v if v is not None else 0.0) / around)
        res["ratios"].append(ratio)
        res["one_time_s"].append(lost)
        minutes = (t1 - t0) / 60
        per = {k: s["cpu"].get(k, 0.0) / minutes for k in PARTS}
        hooked_min = max((b - a) / 60, 1e-9)
        per["patient_writer"] = writer_cpu_s(out) / hooked_min
        extra = extra_cpu_s(rows, typical_cpu, [(a, b)])
        per["patient_hooks_main"] = extra / hooked_min if extra is not None else float("nan")
        res["cpu_per_min"].append(per)
        print(f"block {len(res['ratios'])}: steady {b - a:.1f} s, ratio {ratio:.4f}; one-time {lost:+.2f} s "
              f"(gdb {s['gdb_s'] or 0:.2f} s, install {1000 * (s['install_s'] or 0):.0f} ms)"
              + ("" if hooked else " [not hooked: whole block]"), flush=True)
    return res


# -- run ----------------------------------------------------------------------------------------
def tree(pid: int) -> list[int]:
    """``pid`` and every process under it (the doctor, its patient, the patient's workers)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def wait_lines(log: Path, n: int, limit_s: float = 180.0) -> float:
    """Wait until the step log has ``n`` lines; the time it did."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            return time.time()
        time.sleep(0.05)
    raise SystemExit(f"{log}: fewer than {n} steps after {limit_s:.0f} s")


def run_mode(args: argparse.Namespace, tmp: Path, pargs: list[str]) -> dict[str, Any]:
    """ONE patient under ``gpudoctor run``, its profiled and bare slots interleaved.

    Two processes of the same probe differ by themselves here (A/A pairs of separate
    processes gave means from 0.918 to 1.146 on this VM), so run's steady state is measured
    within one process, as attach's is: in a bare slot the patient's hooks are removed
    (``hooks.uninstall()``, SIGUSR1 to the probe and its workers, ``--toggle-hooks``) and
    the doctor's process is stopped (SIGSTOP: its samplers, its wait, its threads); in a
    profiled slot the doctor runs on and the hooks are installed again (SIGUSR2), as in the
    run. Each profiled slot is compared with the bare slots either side; a step cut by a
    switch is left out with ``--settle-slot``. The one-time costs are the doctor's start-up
    (launch to first step, over a bare launch's, each alone) and its report after the
    patient's last step (over the bare probe's own ending). ``--control`` never switches
    anything on, every slot switched off alike: the floor of the design.
    """
    start_s, report_s = one_time_costs(args, tmp, pargs)
    cmds, logs, until, out = commands(tmp, pargs, "long", args.refork)
    t_launch = time.time()
    proc = subprocess.Popen(cmds["profiled"], stdout=subprocess.DEVNULL, stderr=_doctor_stderr(args.live),
                            env=doctor_env(), cwd=ROOT)
    wait_lines(logs["profiled"], 10)
    time.sleep(args.settle)
    doctor = proc.pid
    patient = patient_tree(doctor)
    blocks: list[tuple[str, float, float]] = []
    awake_s = time.time() - t_launch  # the doctor's time awake, for CPU per minute
    hooks, doctor_too = args.switch in ("all", "hooks"), args.switch in ("all", "doctor")

    def switched() -> list[int]:
        """Whom a hooks switch reaches: the probe and its workers, or with --refork the probe alone."""
        pids = patient_tree(doctor) or patient
        return pids[:1] if args.refork else pids

    for i in range(2 * args.blocks + 1):
        kind = "profiled" if i % 2 else "bare"
        if kind == "bare" or args.control:  # A/A: every slot gets the switch-off (with --refork: a new pass)
            if hooks:
                signal_pids(switched(), signal.SIGUSR1)  # hooks out, recording flushed and closed
            if doctor_too:
                signal_pids(doctor_side(doctor), signal.SIGSTOP)
        else:
            if doctor_too:
                signal_pids(doctor_side(doctor), signal.SIGCONT)
            if hooks:
                signal_pids(switched(), signal.SIGUSR2)  # hooks back in, training underway
        t0 = time.time()
        time.sleep(args.seconds)
        t1 = time.time()
        blocks.append((kind, t0 + args.settle_slot, t1))
        if kind == "profiled" and not args.control:
            awake_s += t1 - t0
    signal_pids(doctor_side(doctor), signal.SIGCONT)
    signal_pids(switched(), signal.SIGUSR2)  # the run ends as it ran: recorded
    end_patient(proc, until["profiled"])
    steps, rows = read_steps(logs["profiled"]), cpu_rows(logs["profiled"])
    bare_spans = [(t0, t1) for kind, t0, t1 in blocks if kind == "bare"]
    typical = typical_seconds(steps, bare_spans)
    typical_cpu = cpu_per_width(rows, bare_spans)
    meta = json.loads((out / "meta.json").read_text())
    cpu = meta.get("doctor_cpu_s") or {}
    res: dict[str, Any] = {"ratios": [], "one_time_s": [], "cpu_per_min": [], "priority": meta.get("doctor_priority"),
                           "start_s": start_s, "report_s": report_s}
    for i in range(1, len(blocks), 2):
        _, t0, t1 = blocks[i]
        around_v = [speed(steps, typical, b[1], b[2]) for b in (blocks[i - 1], blocks[i + 1])]
        ok = [v for v in around_v if v is not None]
        mine = speed(steps, typical, t0, t1)
        if mine is None or not ok:
            print(f"slot {len(res['ratios']) + 1}: too few steps to compare", flush=True)
            continue
        res["ratios"].append(mine / statistics.fmean(ok))
        print(f"slot {len(res['ratios'])}: bare {around_v[0] or float('nan'):.4f} / {around_v[1] or float('nan'):.4f}, "
              f"profiled {mine:.4f} (speed vs a typical bare step); ratio {res['ratios'][-1]:.4f}", flush=True)
    spans = [(t0, t1) for kind, t0, t1 in blocks if kind == "profiled"]
    awake = sum(t1 - t0 for t0, t1 in spans) / 60
    per = {k: cpu.get(k, 0.0) / (awake_s / 60) for k in PARTS}
    per["patient_writer"] = writer_cpu_s(out) / (awake_s / 60)  # recording, like the doctor: start-up and profiled slots
    extra = extra_cpu_s(rows, typical_cpu, spans)
    per["patient_hooks_main"] = extra / awake if extra is not None else float("nan")
    res["cpu_per_min"].append(per)
    return res


def _doctor_stderr(live: bool) -> int:
    """A pipe, or with ``--live`` a pseudo-terminal (drained by a thread): then run draws its live panel."""
    if not live:
        return subprocess.PIPE
    import fcntl
    import pty
    import struct
    import termios
    import threading

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a panel needs rows

    def drain() -> None:
        with contextlib.suppress(OSError):
            while os.read(master, 65536):
                pass

    threading.Thread(target=drain, daemon=True).start()
    return slave


def commands(tmp: Path, pargs: list[str], tag: str, refork: bool = False) -> tuple[
        dict[str, list[str]], dict[str, Path], dict[str, Path], Path]:
    """The bare probe's command and the same under ``gpudoctor run``; their step logs, stop files, run folder."""
    until = {k: tmp / f"until-{k}-{tag}" for k in ("bare", "profiled")}
    logs = {k: tmp / f"{k}-{tag}.log" for k in ("bare", "profiled")}
    out = tmp / f"run-{tag}"
    probe = [sys.executable, str(PROBE), "--seconds", "100000", *pargs]
    cmds = {
        "bare": [*probe, "--truth", str(tmp / f"truth-bare-{tag}.json"), "--step-log", str(logs["bare"]),
                 "--until-file", str(until["bare"])],
        "profiled": [sys.executable, "-m", "gpudoctor", "run", "--out", str(out), "--", *probe, "--toggle-hooks",
                     *(["--refork-on-toggle"] if refork else []),
                     "--truth", str(tmp / f"truth-profiled-{tag}.json"), "--step-log", str(logs["profiled"]),
                     "--until-file", str(until["profiled"])],
    }
    return cmds, logs, until, out


def one_time_costs(args: argparse.Namespace, tmp: Path, pargs: list[str]) -> tuple[list[float], list[float]]:
    """``--launches`` bare and profiled launches in turn, each alone, to its 10th step and ended:
    run's start-up (launch to first step) and its ending (stop asked to exit: the report) over a bare one's."""
    start_s: list[float] = []
    report_s: list[float] = []
    for n in range(args.launches):
        cmds, logs, until, _ = commands(tmp, pargs, f"once-{n}")
        first: dict[str, float] = {}
        ending: dict[str, float] = {}
        for kind in ("bare", "profiled"):
            t0 = time.time()
            proc = subprocess.Popen(cmds[kind], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env=doctor_env(), cwd=ROOT)
            first[kind] = wait_lines(logs[kind], 1) - t0
            wait_lines(logs[kind], 10)
            ending[kind] = end_patient(proc, until[kind])
        start_s.append(first["profiled"] - first["bare"])
        report_s.append(ending["profiled"] - ending["bare"])
    return start_s, report_s


def patient_tree(doctor: int) -> list[int]:
    """The probe, then its DataLoader workers (forks: the same command line), never anything else of ours."""
    try:
        kids = psutil.Process(doctor).children()
    except psutil.Error:
        return []
    main = [k.pid for k in kids if _is_probe(k.pid)][:1]
    return main + [p for p in tree(main[0])[1:] if _is_probe(p)] if main else []


def doctor_side(doctor: int) -> list[int]:
    """The doctor's process and any child of its that is not the patient."""
    probe = set(patient_tree(doctor))
    return [p for p in tree(doctor) if p not in probe]


def _is_probe(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return str(PROBE) in psutil.Process(pid).cmdline()
    return False


def signal_pids(pids: list[int], sig: signal.Signals) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def end_patient(proc: subprocess.Popen[bytes], until: Path) -> float:
    """Ask the probe to stop after its step; seconds until its command (the doctor, for run) exits."""
    t0 = time.time()
    until.write_text("")
    proc.communicate()
    return time.time() - t0


# -- summary ------------------------------------------------------------------------------------
def mean_se(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return float("nan"), float("nan")
    se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else float("nan")
    return statistics.fmean(vals), se


def summary(args: argparse.Namespace, res: dict[str, Any]) -> None:
    ratios = res["ratios"]
    if not ratios:
        print("no block could be compared")
        return
    logs = [math.log(r) for r in ratios]
    gm = math.exp(statistics.fmean(logs))
    se = gm * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    what = f" (bare slots without: {args.switch}{', A/A control' if args.control else ''})" if args.mode == "run" else ""
    print(f"{args.mode}{what}, patient {args.patient} on {args.cores} cores: {len(ratios)} blocks; profiled/bare "
          f"geometric mean {gm:.4f} ± {se:.4f} (standard error), median {statistics.median(ratios):.4f}")
    if res["one_time_s"]:
        m, s = mean_se(res["one_time_s"])
        print(f"one-time cost per attach (gdb, install, detach, report): {m:.2f} ± {s:.2f} s of the patient's "
              f"work; the first session's: {res['one_time_s'][0]:.2f} s")
    if res.get("start_s"):
        m, se = mean_se(res["start_s"])
        r, rse = mean_se(res["report_s"])
        print(f"one-time cost of run: start-up {m:+.2f} ± {se:.2f} s before the first step (over a bare launch), "
              f"report {r:.2f} ± {rse:.2f} s after the last step (the patient has ended; the user waits)")
    print(f"doctor priority: {json.dumps(res['priority'])}")
    print("CPU seconds per minute, by part (mean ± SE over blocks):")
    for key in (*PARTS, "patient_writer", "patient_hooks_main"):
        m, s = mean_se([p.get(key, float("nan")) for p in res["cpu_per_min"]])
        if not math.isnan(m):
            print(f"  {key:24s} {m:8.3f} ± {s:.3f}")
    print(f"COST_PCT={100 * (1 - gm):.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("run", "attach"), default="attach")
    p.add_argument("--patient", choices=("threads", "workers", "both"), default="threads")
    p.add_argument("--blocks", type=int, default=8, help="profiled blocks / runs (default 8)")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds per block or run (default 30)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="threads/workers (default: all cores)")
    p.add_argument("--worker-ms", type=float, default=40.0, help="CPU ms per batch in a worker (default 40)")
    p.add_argument("--settle", type=float, default=2.0, help="attach: seconds after start-up before block 1")
    p.add_argument("--control", action="store_true",
                   help="run: an A/A test, run's parts never switched back on: every slot gets the switch-off (with "
                        "--refork a new pass over the data), the floor of the design")
    p.add_argument("--switch", choices=("all", "hooks", "doctor"), default="all",
                   help="run: which of run's parts a bare slot goes without: all (default), only the hooks "
                        "in the patient, or only the doctor's process (the cost split by part)")
    p.add_argument("--refork", action="store_true",
                   help="run: switch the hooks in the probe's main process only and start a new pass over the "
                        "data at each switch, whose workers fork with the hooks or without, as a run's workers do")
    p.add_argument("--launches", type=int, default=3,
                   help="run: bare and profiled launches in turn for the one-time costs (default 3)")
    p.add_argument("--settle-slot", type=float, default=0.5,
                   help="run: seconds at the start of each slot left out (caches refill after a stop)")
    p.add_argument("--settle-hooked", type=float, default=1.0,
                   help="attach: seconds after the install still counted as one-time (default 1)")
    p.add_argument("--live", action="store_true",
                   help="run: the doctor's stderr on a pseudo-terminal, so its live panel is drawn (issue 36); "
                        "compare COST_PCT with and without")
    p.add_argument("--keep", action="store_true", help="keep the step logs and run folders (printed: where)")
    p.add_argument("doctor_args", nargs="*", help="extra 'gpudoctor attach' options, after --")
    args = p.parse_args(argv)
    pargs = patient_args(args.patient, args.cores, args.worker_ms)
    print(f"patient: healthy probe {' '.join(pargs)}; load average now {os.getloadavg()[0]:.2f} "
          "(anything else running makes these numbers noise)", flush=True)
    if args.keep:  # the step logs and run folders, to look at a block that stands out
        name = tempfile.mkdtemp(prefix="gpudoctor-sat-")
        print(f"keeping the logs and run folders in {name}", flush=True)
        res = (attach_mode if args.mode == "attach" else run_mode)(args, Path(name), pargs)
    else:
        with tempfile.TemporaryDirectory(prefix="gpudoctor-sat-") as name:
            res = (attach_mode if args.mode == "attach" else run_mode)(args, Path(name), pargs)
    summary(args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
