"""Bad input, through the real CLI: one line ``gpudoctor: ...``, a non-zero exit, no traceback
(unless ``--debug``); where a run happened, its report is still written. Errors found before anything
starts, and the commands that only read and render, call ``cli.main`` in this process (``cli``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudoctor.launch.launcher import RunSpec
from gpudoctor.launch.launcher import run as doctor_run
from tests.conftest import ROOT, cli, gpudoctor_cmd, run_cli
from tests.fake_nvml import FakeBinding, FakeGpu

TINY = str(ROOT / "tests" / "scripts" / "tiny_loop.py")
GIB = 1024**3


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    assert proc.returncode != 0, proc.stderr
    if code is not None:
        assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gpudoctor: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real recording of the tiny loop (copied by tests that damage it)."""
    folder = tmp_path_factory.mktemp("rec") / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, TINY, "--seconds", "1.5")
    assert proc.returncode == 0, proc.stderr
    return folder


@pytest.mark.parametrize("args", [["bogus"], ["--bogus"], ["run", "--bogus", "--", "true"],
                                  ["check", "x", "--max-waste", "lots"], ["diff", "only-one"]])
def test_unknown_commands_and_options(args):
    assert "see 'gpudoctor" in assert_one_line_error(cli(*args), 2)


def test_debug_shows_the_traceback():
    proc = run_cli("report", "/nonexistent/run", "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize("args", [["run"], ["run", "--"]])
def test_run_without_a_command(args):
    assert "no command to run" in assert_one_line_error(cli(*args), 2)


def test_run_a_command_that_does_not_exist(tmp_path):
    line = assert_one_line_error(run_cli("run", "--out", str(tmp_path / "r"), "--", "no-such-cmd-xyz"), 127)
    assert "no-such-cmd-xyz" in line
    assert not (tmp_path / "r").exists()  # no empty run folder left behind


def test_a_command_that_cannot_start_leaves_an_earlier_recording_where_it_was(tmp_path, recorded):
    out = tmp_path / "r"
    shutil.copytree(recorded, out)
    before = sorted(p.name for p in out.iterdir())
    script = tmp_path / "bad.sh"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    assert "bad.sh" in assert_one_line_error(run_cli("run", "--out", str(out), "--", str(script)), 127)
    assert sorted(p.name for p in out.iterdir()) == before
    line = assert_one_line_error(run_cli("run", "--out", str(tmp_path / "n"), "--", str(ROOT / "README.md")), 126)
    assert "not an executable file" in line and not (tmp_path / "n").exists()


def test_a_script_that_crashes_at_once_still_gets_a_report(tmp_path):
    proc = run_cli("run", "--out", str(tmp_path / "r"), "--", sys.executable, TINY, "--crash")
    assert proc.returncode == 1
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["run"]["status"] == "crashed" and report["run"]["exit_code"] == 1
    assert (tmp_path / "r" / "report.html").exists()


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_unwritable_out(tmp_path, where):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "run" if where == "under-a-file" else Path("/proc/gpudoctor-run")
    line = assert_one_line_error(cli("run", "--out", str(out), "--", sys.executable, "-c", "pass"), 2)
    assert "--out" in line and str(out) in line


def test_an_out_that_fills_up_stops_recording_not_training(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tiny tmpfs here (needs root) to fill up")
    try:
        proc = run_cli("run", "--out", str(mount / "run"), "--", sys.executable, TINY, "--seconds", "2")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr  # the training's code
        doctor, *hooks = reversed([ln for ln in proc.stderr.splitlines() if ln.startswith("gpudoctor: ")])
        assert "could not write to --out" in doctor and "training exited with 0" in doctor, proc.stderr
        assert all("stopped recording in pid" in ln for ln in hooks), proc.stderr  # the hooks said so too
        assert "step 1" in proc.stdout  # the patient trained to the end, unharmed
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


MALFORMED = {
    "truncated.json": '{"schema": "gpudoctor.report/1", "run": {"mode": "run", "comm',
    "not-json.json": "this is not json",
    "other-version.json": '{"schema": "gpudoctor.report/2", "run": {}}',
    "wrong-types.json": '{"schema": "gpudoctor.report/1", "run": 1, "breakdown": [], "findings": {}, '
                        '"cost": "free", "verdict": 3}',
    "binary.json": "\udcff\udcfe\x00",
    "deep.json": "[" * 100_000,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["report", "diff", "check"])
def test_malformed_report_json(tmp_path, recorded, name, command):
    path = tmp_path / name
    path.write_bytes(MALFORMED[name].encode("utf-8", "surrogateescape"))
    args = {"report": ["report", str(path), "-o", str(tmp_path / "out.html")],
            "diff": ["diff", str(recorded / "report.json"), str(path)],
            "check": ["check", str(path), "--max-waste", "0.5"]}[command]
    assert str(path) in assert_one_line_error(cli(*args), 2)


def test_truncated_recording_and_missing_meta_still_render(tmp_path, recorded):
    folder = tmp_path / "run"
    shutil.copytree(recorded, folder)
    (folder / "meta.json").unlink()
    (folder / "report.json").unlink()
    for path in [folder / "samples" / "host.jsonl", *sorted((folder / "events").glob("*.jsonl"))]:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 7] + b'{"k":"st\x00\xff')  # cut mid-line, then garbage
    proc = cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((folder / "report.json").read_text())
    notes = " ".join(report["notes"])
    assert "meta.json is missing" in notes and "skipped" in notes
    assert report["steps"]["count"] > 10  # what was recorded still counts


def _run_in_process(tmp_path: Path, binding: FakeBinding, seconds: float) -> tuple[int, dict, Path]:
    ran = doctor_run(RunSpec([sys.executable, TINY, "--seconds", str(seconds)], tmp_path / "run",
                             nvml_binding=binding))
    assert ran.report is not None
    return ran.code, ran.report, ran.folder


def test_nvml_driver_library_mismatch_runs_on_host_figures(tmp_path):
    binding = FakeBinding([FakeGpu("Fake H100", "GPU-1", 80 * GIB, 0, 0, 0, 0)], init_error=18)
    code, report, _ = _run_in_process(tmp_path, binding, 1.0)
    assert code == 0
    assert report["shares"]["gpu_busy"] is None
    evidence = [f["evidence"] for f in report["findings"] if f["rule"] == "gpu_unavailable"]
    assert any("version mismatch" in e for e in evidence), report["findings"]


def test_a_gpu_that_falls_off_the_bus_mid_run(tmp_path):
    gpu = FakeGpu("Fake H100", "GPU-1", 80 * GIB, 20 * GIB, 90, 300_000, 1980)
    samples = tmp_path / "run" / "samples" / "gpu.jsonl"

    def fall_off_after_two_rows() -> None:  # by rows on disk, not seconds: a busy machine starts late
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not samples.exists() or samples.read_bytes().count(b"\n") < 2):
            time.sleep(0.02)
        gpu.lost = True

    threading.Thread(target=fall_off_after_two_rows, daemon=True).start()
    code, report, folder = _run_in_process(tmp_path, FakeBinding([gpu]), 4.0)
    assert code == 0  # the run completes
    rows = [json.loads(x) for x in (folder / "samples" / "gpu.jsonl").read_text().splitlines()]
    assert not rows[0]["gpus"][0]["lost"] and rows[-1]["gpus"][0]["lost"]
    evidence = " ".join(f["evidence"] for f in report["findings"] if f["severity"] == "info")
    assert "GPU 0 (Fake H100) is lost" in evidence
    assert "is lost" in (folder / "report.md").read_text()


def test_ctrl_c_twice_terminates_the_training_and_writes_the_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(gpudoctor_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, TINY,
                                          "--seconds", "60", "--ignore-sigint"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("step")  # training has begun
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    time.sleep(0.5)
    assert proc.poll() is None  # the first one waits for the training to stop itself
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "Traceback" not in err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["run"]["status"] == "interrupted"
    assert report["steps"]["count"] > 0


def test_ctrl_c_leaves_the_doctors_line_whole_beside_the_trainings_traceback(tmp_path):
    """The doctor's line and the training's KeyboardInterrupt traceback share the terminal: the line
    is one write with its newline, so the traceback never runs into it ("...recorded.Traceback")."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(gpudoctor_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, TINY,
                                          "--seconds", "60"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("step")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "The report will cover what was recorded.\n" in err
    assert all(line.startswith("Traceback") for line in err.splitlines() if "Traceback" in line)


def test_attach_to_a_wrapper_that_runs_no_python_is_refused_at_once(tmp_path):
    """A shell around a non-Python program: refused before any waiting (not after --duration)."""
    wrapper = subprocess.Popen(["bash", "-c", "sleep 120; true"])
    try:
        time.sleep(0.2)  # bash has started its child
        proc = run_cli("attach", str(wrapper.pid), "--out", str(tmp_path / "a"), "--duration", "600", timeout=60)
        line = assert_one_line_error(proc, 2)
        assert "is not a Python process and starts none" in line and wrapper.poll() is None
        assert not (tmp_path / "a").exists()
    finally:
        wrapper.kill()
        wrapper.wait()
