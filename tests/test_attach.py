"""``gpudoctor attach`` on live probes: each started as its own process, then attached to.

What a user relies on: the planted waste is the top finding with its share
close to the probe's own ground truth (as under ``gpudoctor run``), the
healthy control stays clean, the process trains on unharmed after the doctor
detaches, and bad input gets one clear line and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROBES, ROOT, gpudoctor_cmd, run_cli, within

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None or sys.platform != "linux",
                                reason="attach injects with gdb on Linux")


def start(*argv: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDOCTOR_")}
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def start_probe(name: str, truth: Path, *args: str) -> subprocess.Popen[str]:
    return start(sys.executable, str(PROBES / f"{name}.py"), "--truth", str(truth), *args)


def wait_until(ready: Any, what: str, timeout_s: float = 180.0) -> None:
    """Poll for a condition a busy machine reaches late but surely (never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"never saw: {what}"
        time.sleep(0.05)


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def long_patient(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
    """The healthy probe, training until the test creates its stop file; returns it and that file.

    Its step log tells the test when it is mid-run, by steps, however slow the machine."""
    stop = tmp / "stop"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUDOCTOR_")}
    probe = subprocess.Popen([sys.executable, str(PROBES / "healthy.py"), "--seconds", "600", "--until-file",
                              str(stop), "--step-log", str(tmp / "steps.log"), "--truth", str(tmp / "truth.json"),
                              *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**base, **(env or {})})
    return probe, stop


def attach(pid: int, out: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_cli("attach", str(pid), "--out", str(out), *args, timeout=timeout)


def load(folder: Path, name: str) -> dict[str, Any]:
    return json.loads((folder / name).read_text())


class Attached:
    """A probe attached to right after it started, run to its end."""

    def __init__(self, tmp: Path, name: str, *args: str, doctor_args: tuple[str, ...] = ()) -> None:
        truth = tmp / f"truth-{name}.json"
        self.folder = tmp / f"attach-{name}"
        self.probe = start_probe(name, truth, *args)
        time.sleep(0.3)
        self.doctor = attach(self.probe.pid, self.folder, *doctor_args)
        self.probe_out, self.probe_err = self.probe.communicate(timeout=120)
        self.report = load(self.folder, "report.json")
        self.meta = load(self.folder, "meta.json")
        assert truth.exists(), (f"the probe wrote no truth (exit {self.probe.returncode}); its stderr ends: "
                                 f"{self.probe_err[-2000:]!r}")
        self.truth = load(tmp, truth.name)

    @property
    def top(self) -> dict[str, Any]:
        return self.report["findings"][0]


_runs: dict[tuple[str, ...], Attached] = {}


@pytest.fixture(scope="module")
def attached(tmp_path_factory: pytest.TempPathFactory):
    def get(name: str, *args: str, doctor_args: tuple[str, ...] = ()) -> Attached:
        key = (name, *args, *doctor_args)
        if key not in _runs:
            _runs[key] = Attached(tmp_path_factory.mktemp(name), name, *args, doctor_args=doctor_args)
        return _runs[key]

    return get


# -- planted waste, measured through the injected hooks ------------------------------------
@pytest.mark.slow
@pytest.mark.gdb_inject
def test_tokenization_probe_attached_after_start_matches_truth(attached):
    # The probe waits for the hooks before its first step (up to 120 s, counted as its startup): even quiet,
    # the injection landed 0.1 s after the loop began once, and a report met mid-run has no startup to compare.
    run = attached("tokenize_in_getitem", "--wait-for-attach", "120")
    assert run.probe.returncode == 0, run.probe_err[-2000:]
    assert run.doctor.returncode == 0, run.doctor.stderr[-2000:]
    target = run.meta["attach"]["targets"][0]
    assert target["method"] == "gdb" and target["installed_at"] and target["error"] is None
    assert target["underway"] is False  # in during startup: the report's window holds the startup
    assert run.top["rule"] == "tokenization_in_loop", [(f["rule"], f["waste_fraction"]) for f in run.report["findings"]]
    assert within(run.report["shares"]["tokenization"], run.truth["tokenize_share"])
    assert within(run.report["breakdown"]["data_wait"], run.truth["data_wait_share"])
    assert within(run.report["breakdown"]["startup"], run.truth["startup_share"])
    assert run.report["run"]["mode"] == "attach"


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_checkpoint_probe_attached_after_start_matches_truth(attached):
    run = attached("heavy_checkpoints")
    assert run.probe.returncode == 0 and run.doctor.returncode == 0, run.doctor.stderr[-2000:]
    assert run.top["rule"] == "checkpoint_overhead", [(f["rule"], f["waste_fraction"]) for f in run.report["findings"]]
    # As a share of training time: a busy machine can install the hooks after the loop began, and
    # the report's window starts there (it saves every step, so its share is steady over training).
    b, truth = run.report["breakdown"], run.truth
    assert within(b["checkpoint"] / (1 - b["startup"]), truth["checkpoint_share"] / (1 - truth["startup_share"]))


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_healthy_control_attached_has_no_finding_above_10_percent(attached):
    run = attached("healthy", "--seconds", "8")
    assert run.probe.returncode == 0 and run.doctor.returncode == 0, run.doctor.stderr[-2000:]
    big = [(f["rule"], f["waste_fraction"]) for f in run.report["findings"] if f["waste_fraction"] > 0.10]
    assert not big
    assert abs(sum(run.report["breakdown"].values()) - 1.0) <= 0.01


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_hand_written_eval_attached_after_start_matches_truth(attached):
    """nanoGPT's estimate_loss() under @torch.no_grad(): eval, not compute, under attach too."""
    run = attached("nanogpt_like")
    assert run.probe.returncode == 0 and run.doctor.returncode == 0, run.doctor.stderr[-2000:]
    assert run.top["rule"] == "eval_overhead", [(f["rule"], f["waste_fraction"]) for f in run.report["findings"]]
    assert "`--eval_interval=" in run.top["fix"]["summary"]  # the script's own configurator flag
    # Over the window the report covers: the whole run when the hooks went in before the first
    # step, else from the hooks on (a busy machine can install them after the loop began).
    lo, hi = run.meta["start_time"], run.meta["end_time"]
    seen = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in run.truth["eval_windows"])
    assert within(run.report["breakdown"]["eval"], seen / (hi - lo)), (seen / (hi - lo), run.truth["eval_share"])


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_attach_notes_reach_every_report_format(attached):
    """What was loaded, from when, what is estimated: in report.json, .html and .md, not only meta.json."""
    run = attached("nanogpt_like", doctor_args=("--no-inject",))
    section = run.report["attach"]  # whatever the samples caught: the report says what it is made of
    assert section["process_age_s"] > 0 and "not loaded" in section["loaded"][0]
    assert "stack samples" in section["estimated"][0] and section["notes"] == run.meta["attach_notes"]
    assert run.report["timeline"]["origin"] == "attach"
    assert "since the attach" in run.report["timeline"]["caption"]
    html = (run.folder / "report.html").read_text()
    md = (run.folder / "report.md").read_text()
    for line in (section["loaded"][0], section["estimated"][0]):
        assert line in run.report["notes"]
        assert line.split(";")[0].split("(")[0] in md
        assert line.split(";")[0].split("(")[0] in html
    assert "Seconds since the attach (the process was" in html


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_a_plain_sgd_loop_met_mid_run_is_training_not_starting(tmp_path: Path):
    """No optimizer, no DataLoader: its backward passes and parameter updates say it is training."""
    stop = tmp_path / "stop"
    probe = start(sys.executable, str(ROOT / "tests" / "scripts" / "plain_sgd.py"), "--seconds", "600",
                  "--until-file", str(stop))
    assert probe.stdout is not None
    while not probe.stdout.readline().startswith("step 200"):  # training for a while: mid-run
        assert probe.poll() is None
    doctor = attach(probe.pid, tmp_path / "run", "--duration", "4")
    stop.touch()
    rest, err = probe.communicate(timeout=120)
    out = rest
    assert probe.returncode == 0 and doctor.returncode == 0, (err[-2000:], doctor.stderr[-2000:])
    target = load(tmp_path / "run", "meta.json")["attach"]["targets"][0]
    assert target["underway"] is True
    report = load(tmp_path / "run", "report.json")
    assert report["breakdown"]["startup"] == 0.0
    total = int(out.strip().splitlines()[-1].removeprefix("STEPS="))
    assert 0 < report["steps"]["count"] < total


# -- the patient is left as it was ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.gdb_inject
def test_detach_leaves_the_process_training_to_a_correct_end(tmp_path: Path):
    truth = tmp_path / "truth.json"
    probe, stop = long_patient(tmp_path)
    wait_until(lambda: lines(tmp_path / "steps.log") >= 30, "30 steps: mid-run, the loop is going")
    doctor = attach(probe.pid, tmp_path / "run", "--duration", "3")
    detached_at = time.time()
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    assert probe.poll() is None, "the patient must outlive the doctor"
    after = lines(tmp_path / "steps.log")
    wait_until(lambda: lines(tmp_path / "steps.log") >= after + 10, "10 more steps after the detach")
    stop.touch()
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1].startswith("STEPS_PER_S=")
    assert "Traceback" not in err and "gpudoctor" not in err
    meta = load(tmp_path / "run", "meta.json")
    target = meta["attach"]["targets"][0]
    assert target["underway"] is True and target["detached"] is True
    # what the session took from the patient's own threads is on record
    assert 0 < target["install_s"] < 2 and 0 <= target["uninstall_s"] < 1
    report = load(tmp_path / "run", "report.json")
    assert report["breakdown"]["startup"] == 0.0  # met mid-run: no startup was observed
    # It kept stepping after the detach, and the hooks wrote nothing more.
    assert json.loads(truth.read_text())["steps"] > report["steps"]["count"] > 0
    events = (tmp_path / "run" / "events" / f"{probe.pid}.jsonl").read_text().splitlines()
    assert max(json.loads(line).get("t", 0) for line in events) < detached_at + 1.0


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_detach_during_a_profiler_window_closes_it_on_the_main_thread(tmp_path: Path):
    # A torch.profiler window belongs to the thread that opened it: closed from the watchdog
    # thread, it stayed open in the patient (torch: "disableProfiler called but no active
    # profiling session found", "Leaked callback handle"). Forced open 20 steps after each
    # install and never closed by itself, every detach here lands inside it.
    probe, stop = long_patient(tmp_path, env={"GPUDOCTOR_PROFILE_WINDOW": "20:1000000"})
    wait_until(lambda: lines(tmp_path / "steps.log") >= 5, "training has begun")
    for i in range(2):  # the second session must install as cleanly as the first
        doctor = attach(probe.pid, tmp_path / f"run-{i}", "--duration", "4")
        assert doctor.returncode == 0, doctor.stderr[-2000:]
        target = load(tmp_path / f"run-{i}", "meta.json")["attach"]["targets"][0]
        assert target["installed_at"] is not None and target["detached"] is True
    stop.touch()
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0 and out.strip().splitlines()[-1].startswith("STEPS_PER_S="), err[-2000:]
    assert "no active profiling session" not in err and "Leaked callback" not in err, err[-2000:]


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_patient_killed_while_attached_still_gets_a_report(tmp_path: Path):
    probe, _ = long_patient(tmp_path)
    doctor = subprocess.Popen([*gpudoctor_cmd("attach", str(probe.pid), "--out", str(tmp_path / "run"))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    events = tmp_path / "run" / "events" / f"{probe.pid}.jsonl"
    wait_until(lambda: events.exists() and events.read_bytes().count(b'"k":"step"') >= 5,
               "the hooks recorded steps")
    probe.kill()
    probe.wait()
    _, err = doctor.communicate(timeout=60)
    assert doctor.returncode == 0, err[-2000:]
    report = load(tmp_path / "run", "report.json")
    assert report["steps"]["count"] > 0 and report["breakdown"]["compute"] > 0
    assert load(tmp_path / "run", "meta.json")["attach"]["ended_by"] == "exit"


# -- outside only --------------------------------------------------------------------------------
@pytest.mark.slow
def test_without_injection_the_breakdown_is_estimated_from_stack_samples(attached):
    run = attached("tokenize_in_getitem", doctor_args=("--no-inject",))
    assert run.probe.returncode == 0 and run.doctor.returncode == 0, run.doctor.stderr[-2000:]
    assert not list((run.folder / "events").glob("*.jsonl"))  # nothing ran inside the patient
    notes = " ".join(run.meta["attach_notes"])
    assert "--no-inject" in notes and "stack samples" in notes
    assert run.top["rule"] == "tokenization_in_loop"
    # An estimate from a nice-19 sampler's stacks, not a measurement: alone it gave 0.43-0.55 against
    # truths of 0.50-0.54, but in two full-suite runs 0.35 and 0.37 against 0.48 and 0.50 (a low
    # bias on a loaded or noisy host, docs/attach.md). Held to 35%, not the hooks' 25%.
    assert within(run.report["shares"]["tokenization"], run.truth["tokenize_share"], rel=0.35)


# -- several ranks -------------------------------------------------------------------------------
LAUNCHERS = {
    "torchrun": ["torchrun", "--nproc-per-node", "2"],
    # --multi_gpu is accelerate's name for "several processes through torch's elastic launcher";
    # on a machine with no GPU the ranks run on the CPU and the probe picks gloo.
    "accelerate": ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.gdb_inject
def test_a_launcher_gets_every_rank_hooked_and_a_straggler_finding(tmp_path: Path, launcher: str):
    exe, *args = LAUNCHERS[launcher]
    if not Path(sys.executable).with_name(exe).exists():
        pytest.skip(f"{exe} is not installed")
    probe = start(str(Path(sys.executable).with_name(exe)), *args, str(PROBES / "ddp_two_ranks.py"),
                  "--slow-rank", "1", "--steps", "120", "--truth", str(tmp_path / "truth.json"))
    time.sleep(0.3)
    doctor = attach(probe.pid, tmp_path / "run")
    _, err = probe.communicate(timeout=120)
    # torchrun's own summary fills the tail: show the ranks' errors too.
    assert probe.returncode == 0, "\n".join(ln for ln in err.splitlines() if "Error" in ln)[:3000] + err[-1000:]
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    meta = load(tmp_path / "run", "meta.json")
    assert sorted(t["rank"] for t in meta["attach"]["targets"] if t["installed_at"]) == [0, 1]
    report = load(tmp_path / "run", "report.json")
    assert sorted(r["rank"] for r in report["per_rank"]) == [0, 1]
    assert report["findings"][0]["rule"] == "straggler_rank"
    # Each rank's DDP model, built before the hooks came in or after, is known and its all-reduce
    # timed: its settings (a ``ddp`` event) and buckets in the steps' ``comm`` events.
    for path in (tmp_path / "run" / "events").glob("*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not any(r.get("k") == "step" for r in rows):
            continue  # the launcher, a worker
        assert [r["k"] for r in rows].count("ddp") == 1, path.name
        comm = [r for r in rows if r.get("k") == "comm"]
        assert comm and all(r["buckets"] >= 1 for r in comm[1:]), path.name


# -- bad input: one clear line, non-zero exit, nobody hung --------------------------------------
def test_no_such_pid_is_one_clear_line(tmp_path: Path):
    top = int(Path("/proc/sys/kernel/pid_max").read_text())  # a valid pid number, no such process
    free = next(pid for pid in range(top - 1, 1, -1) if not Path(f"/proc/{pid}").exists())
    out = attach(free, tmp_path / "run", timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "no process with pid" in out.stderr


def test_a_process_that_is_not_python_is_refused(tmp_path: Path):
    sleeper = start("sleep", "30")
    try:
        out = attach(sleeper.pid, tmp_path / "run", timeout=30)
        assert out.returncode == 2 and "not a Python process" in out.stderr
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.gdb_inject
def test_a_second_doctor_is_refused_and_ctrl_c_detaches_the_first(tmp_path: Path):
    idle = start(sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)")
    first = subprocess.Popen(gpudoctor_cmd("attach", str(idle.pid), "--out", str(tmp_path / "a")),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        # Installed, not only started: a Ctrl-C before the queued install runs leaves nothing to detach.
        wait_until(lambda: (tmp_path / "a" / "attach" / f"{idle.pid}.installed.json").exists(),
                   "the first doctor's hooks are in the patient")
        second = attach(idle.pid, tmp_path / "b", timeout=30)
        assert second.returncode == 3 and "already attached" in second.stderr
        first.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = first.communicate(timeout=60)
        # Python but not training: the report is written, the exit says nothing was measured.
        assert first.returncode == 1 and "no training activity" in err
        assert idle.poll() is None  # still alive, hooks removed
        meta = load(tmp_path / "a", "meta.json")
        assert meta["attach"]["ended_by"] == "interrupted"
        assert meta["attach"]["targets"][0]["detached"] is True
    finally:
        for proc in (first, idle):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
@pytest.mark.gdb_inject
def test_run_clm_like_attached_mid_run_names_its_own_save_steps_flag(tmp_path: Path):
    """A parser local to main() (run_clm's HfArgumentParser) ran before the attach: the hooks find
    it alive and read its values from the command line, so the fix is still --save_steps."""
    out = tmp_path / "trainer"
    probe = start(sys.executable, str(PROBES / "run_clm_like.py"), "--max_steps", "5000",
                  "--output_dir", str(out), "--truth", str(tmp_path / "truth.json"))
    try:
        wait_until(lambda: (out / "checkpoint-3").exists(), "three checkpoints: parsed and training")
        doctor = attach(probe.pid, tmp_path / "run", "--duration", "6")
        assert doctor.returncode == 0, doctor.stderr[-2000:]
    finally:
        probe.kill()
        probe.wait()
    report = load(tmp_path / "run", "report.json")
    f = next(f for f in report["findings"] if f["rule"] == "checkpoint_overhead")
    assert f"`--save_steps {f['fix']['config']['save_steps']}` instead of its default (1)" in f["fix"]["summary"]
