"""memory_growth: real CPU loops that leak (outputs kept with their graph, workers that cache items)
and a healthy control, under ``gpudoctor run``; the GPU side through the fake NVML's rows.

A leak trains at full speed until the run is killed hours later; the samplers' memory figures
said so from the first minutes. The finding names where it grows, how fast, the memory left and
the hours until it runs out, and the verdict says it; the healthy loop gets none.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis import analyze
from gpudoctor.analysis.memory import trends
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.conftest import ROOT, run_cli
from tests.recording_builder import T0, RecordingBuilder

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

LOOP = ROOT / "tests" / "scripts" / "leaky_loop.py"
_truths: dict[str, dict[str, Any]] = {}  # each loop's own measurement of its growth


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path, str]]:
    """Each loop for 36 s of training: a busy host samples once a second, and the line is drawn through
    the last two thirds of the loop (24 samples; 8 needed). The idle-priority sampler starves on a
    saturated box: at 18 s, beside three test workers on 2 cores, its ticks stretched to 3 s and the line
    had 7; at 24 s a clean-clone CI once wrote 7 rows in the line's 16 s (gaps of 3.5-4.7 s while this
    file's three loops and doctors and the other xdist worker shared the 2 cores). The three run at once,
    each its own ``gpudoctor run`` (each is the others' busy host, as two CPU hogs were when the figures
    were set)."""
    from concurrent.futures import ThreadPoolExecutor

    out = {}
    root = tmp_path_factory.mktemp("leaks")
    leaks = ("outputs", "workers", "none")
    with ThreadPoolExecutor(len(leaks)) as pool:
        procs = dict(zip(leaks, pool.map(lambda leak: run_cli(
            "run", "--out", str(root / leak), "--", sys.executable, str(LOOP), "--leak", leak, "--seconds", "36",
            "--truth", str(root / f"{leak}.truth.json")), leaks), strict=True))
    for leak, proc in procs.items():
        folder = root / leak
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[leak] = (json.loads((folder / "report.json").read_text()), folder, proc.stderr)
        _truths[leak] = json.loads((root / f"{leak}.truth.json").read_text())
    return out


@pytest.mark.parametrize("leak", ["outputs", "workers"])
def test_a_leaking_loop_is_told_when_it_runs_out(leak: str, runs: dict[str, Any]) -> None:
    report, folder, stderr = runs[leak]
    found = [f for f in report["findings"] if f["rule"] == "memory_growth"]
    assert len(found) == 1, ([f["rule"] for f in report["findings"]], trends(analyze(load_recording(folder))))
    f = found[0]
    data = f["data"]
    assert f["risk"] is True and f["claims"] == [] and f["waste_fraction"] == 0
    assert data["where"] == "host" and data["growth_mib_per_hour"] > 0 and data["r2"] >= 0.8
    truth = _truths[leak]["growth_mib_per_hour"]
    assert data["growth_mib_per_hour"] == pytest.approx(truth, rel=0.2)  # the loop's own measurement
    # the line's growth is what the samples show over the loop
    rows = [r for r in load_recording(folder).host if isinstance(r.get("rss_mib"), float)]
    assert data["end_mib"] - data["start_mib"] >= 64 and max(r["rss_mib"] for r in rows) >= data["end_mib"] * 0.8
    assert data["hours_left"] == pytest.approx(data["headroom_mib"] / data["growth_mib_per_hour"], rel=1e-2, abs=0.01)
    assert f["severity"] == "high"  # the host runs out within a day at these rates
    assert "Memory grows steadily" in report["verdict"] and "at this rate" in report["verdict"]
    assert "memory_growth: a risk, not a waste" in stderr
    html = (folder / "report.html").read_text()
    assert "Memory: host RSS of the training processes" in html


def test_the_healthy_loop_has_no_memory_finding(runs: dict[str, Any]) -> None:
    report, folder, _ = runs["none"]
    assert "memory_growth" not in [f["rule"] for f in report["findings"]]
    assert all(not t.steady for t in trends(analyze(load_recording(folder))))


def _gpu_run(tmp_path: Path, used_mib: list[float]) -> dict[str, Any]:  # 60 s of loop: the line from 20 s
    """A GPU run whose NVML rows (the fake binding's figures) give the training process ``used_mib``."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=70.0)
    rows = b.process()
    b.training_loop(rows, start_s=5.0, steps=600, compute_s=0.1, wait_s=0.0, fetch_s=0.0)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    b.gpus_meta = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0}]
    b.gpu = [{"t": T0 + 5.0 + i, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_pct": 95.0,
                                            "mem_used_mib": v + 500.0, "mem_total_mib": 81559.0,
                                            "proc_mem_mib": v, "lost": False}]}
             for i, v in enumerate(used_mib)]
    b.write()
    return build_report(load_recording(tmp_path))


def test_gpu_memory_that_grows_is_named_with_the_gpus_headroom(tmp_path: Path) -> None:
    growing = [30_000.0 + 40.0 * i for i in range(60)]  # 40 MiB a second: 144 GiB an hour
    report = _gpu_run(tmp_path / "grow", growing)
    f = next(f for f in report["findings"] if f["rule"] == "memory_growth")
    assert f["data"]["where"] == "gpu"
    assert f["data"]["growth_mib_per_hour"] == pytest.approx(40.0 * 3600, rel=1e-3)
    free = 81559.0 - (growing[-1] + 500.0)
    assert f["data"]["hours_left"] == pytest.approx(free / (40.0 * 3600), rel=1e-2)
    assert "GPU memory" in f["evidence"]
    assert report["timeline"]["series"]["gpu_mem_mib"][:2] == [30_000.0, 30_040.0]


def test_a_ramp_that_levels_off_is_not_a_leak(tmp_path: Path) -> None:
    """The caching allocator grows for the first steps and stops: growth in the first half only."""
    ramp = [30_000.0 + min(i, 20) * 100.0 for i in range(60)]
    report = _gpu_run(tmp_path / "ramp", ramp)
    assert "memory_growth" not in [f["rule"] for f in report["findings"]]


def _slowed_run(tmp_path: Path, per_step_mib: Callable[[int], float]) -> dict[str, Any]:
    """A CPU loop of 200 steps at 0.1 s, then 100 at 0.3 s (a busy host slowed it), whose host memory
    after ``n`` steps is 500 MiB + ``per_step_mib(n)``, sampled each second."""
    b = RecordingBuilder(tmp_path, cores=2, duration_s=60.0)
    rows = b.process()
    rows.append({"k": "first_step", "t": T0 + 5.0})
    ends = [5.0 + 0.1 * n for n in range(1, 201)] + [25.0 + 0.3 * n for n in range(1, 101)]
    rows += [{"k": "step", "t": T0 + t, "n": n, "dt": 0.001} for n, t in enumerate(ends, 1)]
    b.host_rows(cpu_total_pct=95.0, cpu_proc_pct=100.0)
    b.host = [r for r in b.host if (r["t"] - T0) % 1 < 0.05]
    for r in b.host:
        done = sum(1 for t in ends if T0 + t <= r["t"])
        r["rss_mib"] = 500.0 + per_step_mib(done)
    b.write()
    return build_report(load_recording(tmp_path))


def test_a_leak_per_step_is_a_line_however_the_steps_slow(tmp_path: Path) -> None:
    """5 MiB a step: in time the second half grows a third as fast as the whole (the steps slowed
    threefold), per step at one rate; the leak is steady, its rate in time the line's."""
    report = _slowed_run(tmp_path / "leak", lambda n: 5.0 * n)
    f = next(f for f in report["findings"] if f["rule"] == "memory_growth")
    assert f["data"]["where"] == "host" and f["data"]["r2"] >= 0.99


def test_growth_that_stops_per_step_is_not_a_leak_however_the_steps_slow(tmp_path: Path) -> None:
    report = _slowed_run(tmp_path / "ramp", lambda n: 5.0 * min(n, 150))
    assert "memory_growth" not in [f["rule"] for f in report["findings"]]


@pytest.mark.parametrize("end", [20, -1])  # the window's first sample (the loop's first third is left out) and last
def test_a_sample_off_the_line_at_either_end_of_the_loop_is_the_samplers(tmp_path: Path, end: int) -> None:
    """A clean-clone CI: the tick that shared the leaking loop's last step was stamped before it read the
    tree, by which time the workers had gone (4,428 MiB, then 505 in the window's last sample); as the
    line's end the one sample turned a steady leak's R² to 0.23 and its second half's slope negative."""
    growing = [30_000.0 + 40.0 * i for i in range(60)]
    growing[end] = 1_000.0  # the process's memory at teardown (or before it loaded), read in the window
    report = _gpu_run(tmp_path / "grow", growing)
    f = next(f for f in report["findings"] if f["rule"] == "memory_growth")
    assert f["data"]["r2"] >= 0.99
    assert f["data"]["growth_mib_per_hour"] == pytest.approx(40.0 * 3600, rel=0.02)
