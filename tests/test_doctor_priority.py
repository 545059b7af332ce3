"""The doctor takes only idle cycles (issue 16): its threads and py-spy idle, the training and gdb normal.

Every check reads the kernel's own record (``/proc/<pid>/task/<tid>/stat``, ``ioprio_get``) of
real processes; nothing is timed. The lowering happens in subprocesses, never in pytest itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.analysis.model import time_mean
from gpudoctor.processes import priority
from gpudoctor.samplers.host import HostSampler
from gpudoctor.samplers.pace import (
    MAX_INTERVAL_S,
    SATURATED_IDLE_CORES,
    SATURATED_INTERVAL_S,
    Pace,
    StepClock,
)
from tests.conftest import gpudoctor_cmd

IDLE = 3  # IOPRIO_CLASS_IDLE

# The training child: its own priority, then its parent's (the doctor's) threads once the samplers run.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    from gpudoctor.processes import priority
    me, doctor = os.getpid(), os.getppid()
    def threads(pid):
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            out[tid] = [comm, *priority.thread_priority(pid, int(tid)), priority.get_ioprio_class(int(tid))]
        return out
    deadline = time.time() + 60
    while time.time() < deadline and not any(t[0] == "gd-host" for t in threads(doctor).values()):
        time.sleep(0.05)
    json.dump({"child": [*priority.thread_priority(me, me), priority.get_ioprio_class(0)],
               "doctor": threads(doctor)}, open(sys.argv[1], "w"))
""")


@pytest.mark.parametrize("may_renice", [True, False], ids=["root", "no-cap-sys-nice"])
def test_run_child_keeps_normal_priority_and_the_doctor_is_idle(tmp_path: Path, may_renice: bool) -> None:
    """Without CAP_SYS_NICE (any user's doctor; here root's, its capability dropped) a thread may
    never leave SCHED_IDLE: the host sampler, started from the normal spawner thread, never enters it."""
    drop: list[str] = []
    if not may_renice:
        setpriv = shutil.which("setpriv")
        if setpriv is None or os.geteuid() != 0:
            pytest.skip("needs root and util-linux's setpriv to drop CAP_SYS_NICE")
        drop = [setpriv, "--bounding-set", "-sys_nice", "--"]
    script, seen, out = tmp_path / "child.py", tmp_path / "seen.json", tmp_path / "run"
    script.write_text(CHILD)
    done = subprocess.run([*drop, *gpudoctor_cmd("run", "--out", str(out), "--", sys.executable, str(script),
                                                 str(seen))], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(seen.read_text())
    assert got["child"][:2] == ["SCHED_OTHER", 0] and got["child"][2] in (0, 2)  # none / best effort
    doctor = {comm: rest for comm, *rest in got["doctor"].values()}
    assert "gd-host" in doctor and "gd-spawn" in doctor
    for comm, (policy, nice, io) in doctor.items():
        if comm == "gd-spawn":  # the thread that starts children: kept normal on purpose
            assert (policy, nice) == ("SCHED_OTHER", 0)
        else:
            assert (policy, nice, io) == (_policy_of(comm), 19, IDLE), comm
    meta = json.loads((out / "meta.json").read_text())
    assert meta["doctor_priority"] == {"cpu": "SCHED_IDLE", "io": "idle"}
    assert meta["doctor_cpu_s"]["samplers"] >= 0 and meta["doctor_cpu_s"]["process"] > 0
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["doctor_priority"] == {"cpu": "SCHED_IDLE", "io": "idle"}


# gdb's spawn, through the real _run_gdb, and py-spy's preexec, in a doctor lowered the real way.
SPAWNS = textwrap.dedent("""
    import json, subprocess, sys
    from gpudoctor.processes import priority
    from gpudoctor.attach import inject, stacks
    priority.start_normal_spawner()
    priority.lower_doctor()
    stat = "cat /proc/self/stat; echo; cat /proc/self/task/*/comm >/dev/null"
    gdb = inject._run_gdb(["sh", "-c", stat], 30)
    spy = priority.popen_normal(["sh", "-c", "cat /proc/self/stat"], stdout=subprocess.PIPE, text=True,
                                then=lambda: stacks._pyspy_preexec(__import__("os").getppid())).communicate()[0]
    print(json.dumps({"gdb": gdb.split(")")[-1].split(), "spy": spy.split(")")[-1].split()}))
""")


def test_gdb_runs_normal_and_pyspy_nice_under_an_idle_doctor() -> None:
    """gdb holds the patient stopped: normal priority. py-spy yields (nice 19) but is never
    SCHED_IDLE, which would let it sample only while the patient waits (a biased figure)."""
    # SCHED_IDLE is the point: beside two busy programs its main thread waits 99 s for the CPU to read
    # two short outputs (it passed at 120 s quiet, failed at 120 beside them)
    done = subprocess.run([sys.executable, "-c", SPAWNS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # fields after the comm: [16] nice, [38] policy
    assert (got["gdb"][16], got["gdb"][38]) == ("0", "0")
    assert (got["spy"][16], got["spy"][38]) == ("19", "0")


SWITCH = textwrap.dedent("""
    import sys
    from gpudoctor.processes import priority
    before = sys.getswitchinterval()
    priority.lower_doctor()
    lowered = sys.getswitchinterval()
    priority.restore_doctor()
    print(before, lowered, sys.getswitchinterval())
""")


def test_an_idle_doctor_asks_for_the_gil_ten_times_a_second_not_two_hundred() -> None:
    """Its threads hold the GIL while the patient preempts them; one waiting must not wake every 5 ms."""
    done = subprocess.run([sys.executable, "-c", SWITCH], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    before, lowered, restored = map(float, done.stdout.split())
    assert (before, lowered, restored) == pytest.approx((0.005, priority.IDLE_SWITCH_S, 0.005))


PATIENT = "import time\nwhile True:\n    sum(range(10000)); time.sleep(0.001)\n"


@pytest.mark.gdb_inject
def test_attach_doctor_goes_idle_once_hooked(tmp_path: Path) -> None:
    """nice 10 while gdb and the first stack samples need their timing; SCHED_IDLE once the hooks are in."""
    patient = subprocess.Popen([sys.executable, "-c", PATIENT])
    doctor = subprocess.Popen(gpudoctor_cmd("attach", str(patient.pid), "--duration", "120",
                                            "--out", str(tmp_path / "run")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        threads: dict[str, tuple[str, int, int | None]] = {}
        deadline = time.time() + 120
        while time.time() < deadline and doctor.poll() is None:
            # lowered one by one, the calling thread last (its policy, then its I/O class): wait for all of it
            threads = _threads(doctor.pid)
            if "gd-host" in threads and all(got == (_policy_of(comm), 19, IDLE) for comm, got in threads.items()
                                            if comm != "gd-spawn"):
                break
            time.sleep(0.1)
        threads = _threads(doctor.pid)
        assert "gd-host" in threads and "gd-spawn" in threads, (threads, doctor.stderr and doctor.poll())
        for comm, got in threads.items():
            assert got == (("SCHED_OTHER", 0, got[2]) if comm == "gd-spawn" else (_policy_of(comm), 19, IDLE)), comm
    finally:
        doctor.terminate()
        doctor.wait(timeout=60)
        patient.kill()
        patient.wait()
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["attach"]["targets"][0]["installed_at"]
    assert meta["doctor_priority"]["cpu"] == "SCHED_IDLE once hooked (before: nice 10)"
    assert meta["doctor_priority"]["io"] == "idle once hooked" and "normal" in meta["doctor_priority"]["gdb"]
    # the window over, the doctor went back to normal priority for its detach and report (root here)
    assert meta["doctor_priority"]["after_window"] == "normal: SCHED_OTHER, nice 0"
    assert {"samplers", "py_spy", "stacks_thread", "live_view"} <= set(meta["doctor_cpu_s"])


def _policy_of(comm: str) -> str:
    """A lowered doctor thread's policy: the host sampler keeps its ticks in turn at nice 19, every
    other is idle."""
    return "SCHED_OTHER" if comm == "gd-host" else "SCHED_IDLE"


def _threads(pid: int) -> dict[str, tuple[str, int, int | None]]:
    out = {}
    try:
        for tid in Path(f"/proc/{pid}/task").iterdir():
            comm = (tid / "comm").read_text().strip()
            out[comm] = (*priority.thread_priority(pid, int(tid.name)), priority.get_ioprio_class(int(tid.name)))
    except OSError:
        pass
    return out


# -- adaptive intervals -----------------------------------------------------------------
def _steps(path: Path, times: list[float]) -> None:
    with path.open("a") as fh:
        for n, t in enumerate(times):
            fh.write(json.dumps({"k": "step", "t": t, "n": n, "dt": 0.0}, separators=(",", ":")) + "\n")


def test_interval_grows_with_the_step_time(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    clock = StepClock(events, refresh_s=0.0)
    pace = Pace(0.1, clock)
    assert pace.interval_s() == 0.1  # no step yet
    _steps(events / "1.jsonl", [100.0 + 0.05 * i for i in range(20)])  # fast steps: the base rate holds
    assert pace.interval_s() == 0.1
    _steps(events / "2.jsonl", [200.0 + 2.0 * i for i in range(30)])  # the busiest process: 2 s steps
    assert clock.step_s() == pytest.approx(2.0)
    assert pace.interval_s() == pytest.approx(0.4)
    _steps(events / "2.jsonl", [260.0 + 60.0 * i for i in range(1000)])  # very slow steps: capped
    assert pace.interval_s() == MAX_INTERVAL_S
    (events / "3.jsonl").write_text('{"k":"step","t":1.0')  # a line being written: read later, not parsed
    assert pace.interval_s() == MAX_INTERVAL_S


def test_a_host_with_no_idle_core_is_sampled_once_a_second_and_back_at_the_base_rate_when_one_frees() -> None:
    pace = Pace(0.1, None)
    sampler = HostSampler(os.getpid(), None, interval_s=0.1)
    sampler.pace = pace
    row = sampler.sample()
    assert row is not None  # each tick tells its pace how many cores it left idle
    assert pace.idle_cores == pytest.approx((100 - row["cpu_total_pct"]) / 100 * row["n_cpus"])
    pace.tell_host(100.0, 16)
    assert pace.interval_s() == SATURATED_INTERVAL_S
    pace.tell_host(85.0, 2)  # workers filling 2 cores in bursts: 0.3 of a core idle, none of it ours
    assert pace.interval_s() == SATURATED_INTERVAL_S
    pace.tell_host(90.0, 16)  # 1.6 cores idle: the doctor runs on one of them, beside nobody
    assert pace.interval_s() == 0.1
    pace.tell_host(100.0 * (1 - SATURATED_IDLE_CORES / 2), 2)  # exactly one core idle
    assert pace.interval_s() == 0.1
    pace.tell_host(None, 2)  # no figure: the step-driven interval
    assert pace.interval_s() == 0.1
    slow = Pace(0.1, None)
    slow.base_s = 1.5  # an interval already longer (slow steps) is kept, never shortened
    slow.tell_host(100.0, 2)
    assert slow.interval_s() == 1.5


def test_host_rates_are_weighed_by_the_seconds_each_row_covers() -> None:
    """Eleven 0.1 s rows at 20% busy, then two 1 s rows at 100% (the sampler slowed when saturated):
    1.1 s at 20% and 2 s at 100%, not the thirteen rows' plain mean (32%)."""
    rows = [{"t": 0.1 * i, "cpu_total_pct": 20.0} for i in range(11)]
    rows += [{"t": 2.0, "cpu_total_pct": 100.0}, {"t": 3.0, "cpu_total_pct": 100.0}]
    assert time_mean(rows, "cpu_total_pct") == pytest.approx((1.1 * 20 + 2.0 * 100) / 3.1)
    assert time_mean([{"t": 5.0, "cpu_total_pct": 40.0}], "cpu_total_pct") == 40.0
    # rows of two windows 95 s apart: the later window's first row covers one interval, not the gap
    apart = [{"t": 0.0, "cpu_total_pct": 0.0}, {"t": 1.0, "cpu_total_pct": 0.0},
             {"t": 96.0, "cpu_total_pct": 100.0}, {"t": 97.0, "cpu_total_pct": 100.0}]
    assert time_mean(apart, "cpu_total_pct") == pytest.approx(100.0 * (MAX_INTERVAL_S + 1.0) / (MAX_INTERVAL_S + 3.0))
    assert time_mean([{"t": 5.0, "cpu_total_pct": None}], "cpu_total_pct") is None
    # two rows at one time, one without the figure, and a row whose time is NaN: read, never raised on
    # (hypothesis found the first: the rows' (time, value) pairs compared None with a float)
    odd = [{"t": 1.0, "cpu_total_pct": None}, {"t": 1.0, "cpu_total_pct": 50.0},
           {"t": float("nan"), "cpu_total_pct": 0.0}, {"t": 2.0, "cpu_total_pct": 50.0}]
    assert time_mean(odd, "cpu_total_pct") == pytest.approx(50.0)


SLOW_STEPS = textwrap.dedent("""
    import sys, time, torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        model(torch.ones(2, 4)).sum().backward()
        opt.step(); opt.zero_grad()
        time.sleep(float(sys.argv[2]))
""")


def test_host_sampler_ticks_fewer_times_per_slow_step(tmp_path: Path) -> None:
    """Base 0.05 s beside 0.75 s steps: 15 rows a step unadapted, 5 once the step time is known."""
    script, out = tmp_path / "slow.py", tmp_path / "run"
    script.write_text(SLOW_STEPS)
    done = subprocess.run(gpudoctor_cmd("run", "--out", str(out), "--interval", "0.05", "--",
                                        sys.executable, str(script), "14", "0.75"),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line)["t"] for f in (out / "events").glob("*.jsonl")
             for line in f.read_text().splitlines() if '"k":"step"' in line]
    steps.sort()
    assert len(steps) == 14
    rows = [json.loads(line)["t"] for line in (out / "samples" / "host.jsonl").read_text().splitlines()]
    late = [t for t in rows if steps[8] <= t < steps[13]]  # after the clock has seen steps (5 s refresh)
    assert 0 < len(late) / 5 <= 8, len(late)  # per step: ~5 adapted, ~15 at the base rate
    meta = json.loads((out / "meta.json").read_text())
    assert meta["sampling"]["last_interval_s"] > 0.05


def test_the_step_clock_opens_a_file_only_when_it_grew_and_never_again_once_its_process_is_gone(
        tmp_path: Path) -> None:
    """Workers forked anew each epoch leave a file each: a day of short epochs must not mean thousands of opens a refresh."""
    events = tmp_path / "events"
    events.mkdir()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a worker that has exited: its pid is gone
    worker = events / f"{ended.pid}.jsonl"
    mine = events / f"{os.getpid()}.jsonl"  # a process still running
    _steps(worker, [100.0 + 0.5 * i for i in range(10)])
    _steps(mine, [200.0 + 0.1 * i for i in range(5)])
    clock = StepClock(events, refresh_s=0.0)
    assert clock.step_s() == pytest.approx(0.5)  # the busiest file's steps
    assert clock.opens == 2
    for _ in range(5):
        clock.step_s()
    assert clock.opens == 2  # neither grew: none opened again
    _steps(mine, [201.0 + 0.1 * i for i in range(20)])
    clock.step_s()
    assert clock.opens == 3  # the running process's new lines are read
    _steps(worker, [300.0, 301.0])
    clock.step_s()
    assert clock.opens == 3  # the exited process's file is never read again
