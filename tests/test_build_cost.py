"""Issue #24: a batch build's CPU and waiting decide the data rules, not how busy the host is.

Recordings (tests/recording_builder) of the cases the issue saw: a loader that waits on
storage (quiet and beside a CPU-bound program), a tokenizer whose thread pool a forked
worker loses, a CPU-bound build on a host whose other cores are taken, and a fix that
would repeat the value that ran. The last test runs real DataLoaders under the hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.buildcost import BuildCost, LoopModel, worker_cap
from gpudoctor.launch import launcher
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.recording_builder import RecordingBuilder

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

STEPS = 600
HOG = [{"name": "python3", "pct": 99.0}]


def loop(tmp_path: Path, *, wait_s: float, compute_s: float, build_wall_s: float, build_cpu_s: float,
         run_delay_s: float = 0.0, workers: int = 0, cores: int = 2, cpu_total_pct: float, cpu_proc_pct: float,
         others: list[dict[str, Any]] | None = None, dataset_len: int | None = None, steps: int = STEPS,
         tokenize_s: float = 0.0) -> dict[str, Any]:
    """The report of ``steps`` training steps whose batches take ``build_wall_s`` to build (``tokenize_s``
    of each step tokenizer calls on the training process)."""
    b = RecordingBuilder(tmp_path, cores=cores, duration_s=5.0 + steps * (wait_s + compute_s) + 2.0)
    rows = b.process()
    end = b.training_loop(rows, start_s=5.0, steps=steps, compute_s=compute_s, wait_s=wait_s, num_workers=workers,
                          dataset_len=dataset_len)
    b.fetch_counter(rows, t_s=end, calls=steps, wall_s=build_wall_s, cpu_s=build_cpu_s, run_delay_s=run_delay_s)
    if tokenize_s:
        b.tokenizer_counters(rows, start_s=5.0, end_s=end, total_s=tokenize_s * steps)
    b.host_rows(cpu_total_pct=cpu_total_pct, cpu_proc_pct=cpu_proc_pct, others=others)
    return build_report(load_recording(b.write()))


def top(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["severity"] != "info")


def configs(finding: dict[str, Any]) -> list[dict[str, Any]]:
    fix = finding["fix"]
    return [fix.get("config") or {}, *((t.get("config") or {}) for t in fix.get("also") or [])]


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "beside-a-cpu-bound-program"])
def test_a_build_that_waits_is_io_bound_and_sized_by_littles_law_not_by_cores(tmp_path: Path, busy: bool) -> None:
    # 60 ms a batch blocked on storage (1 ms of CPU, 10 ms waking up for a core), 40 ms of compute:
    # the loop waits 60% of the time.
    report = loop(tmp_path, wait_s=0.06, compute_s=0.04, build_wall_s=0.06, build_cpu_s=0.001, run_delay_s=0.01,
                  cpu_total_pct=72.5 if busy else 22.5, cpu_proc_pct=45.0, others=HOG if busy else None)
    f = top(report)
    assert f["rule"] == "io_bound"  # never cpu_saturated: a blocked worker needs no core
    assert "cpu_saturated" not in {x["rule"] for x in report["findings"]}
    # Little's law: 60 ms a build / 40 ms a step -> 2 in flight; cores do not cap it
    assert f["data"]["littles_law_workers"] == 2 and f["fix"]["config"]["num_workers"] == 2
    # the compute floor, 40 ms, on both hosts: the run's 45 ms of CPU a batch fits in its share of
    # the cores beside one busy program (3 runnable processes of the run and 1 other: 1.5 cores)
    assert f["data"]["predicted_loop_speedup"] == pytest.approx(0.1 / 0.04, rel=0.02)
    assert f["data"]["predicted_loop_speedup_host_alone"] == pytest.approx(0.1 / 0.04, rel=0.02)
    assert f["waste_fraction"] > 0.3  # a 60% wait is never 0% waste
    if busy:  # the other program is named, not blamed on the patient
        assert "python3 (1.0 core)" in f["evidence"]
        assert f["data"]["other_programs"][0]["name"] == "python3"


def test_a_tokenizer_pool_a_forked_worker_loses_is_not_given_one_worker(tmp_path: Path) -> None:
    # The build keeps 1.9 threads busy in the training process (115 ms of CPU in 60 ms of wall).
    # One forked worker builds on one thread: 115 ms a batch, slower than the 80 ms that ran.
    report = loop(tmp_path, wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.115,
                  cpu_total_pct=85.0, cpu_proc_pct=160.0)
    f = top(report)
    assert f["rule"] == "data_stall"
    assert f["data"]["build_threads"] == pytest.approx(1.92, abs=0.01)
    assert f["fix"]["config"]["num_workers"] == 2
    assert "threads busy" in f["evidence"]
    # 2 workers on 2 cores: (13 ms compute CPU + 115 ms build CPU) / 2 = 64 ms a batch, not 115 / 2
    assert f["data"]["predicted_loop_speedup"] == pytest.approx(0.08 / 0.064, rel=0.05)


def test_a_cpu_build_beside_a_busy_program_names_it_and_gives_both_figures(tmp_path: Path) -> None:
    # 60 ms of CPU a build, 20 ms compute, 2 cores, one held by another program.
    report = loop(tmp_path, wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.058, run_delay_s=0.001,
                  cpu_total_pct=100.0, cpu_proc_pct=100.0, others=HOG)
    f = top(report)
    assert f["rule"] == "data_stall" and f["data"]["build_kind"] == "cpu"
    assert "python3 (1.0 core)" in f["evidence"] and "host alone" in f["fix"]["summary"]
    # here: a computing build gets at most as many workers as cores (2); with them the run gets 1.5 of
    # the 2 cores beside it (a fair share among its 3 runnable processes and 1 other): 80 ms of CPU / 1.5
    assert f["fix"]["config"]["num_workers"] == 2
    assert f["data"]["predicted_loop_speedup"] == pytest.approx(1.5, rel=0.02)
    assert f["data"]["predicted_loop_speedup_host_alone"] > f["data"]["predicted_loop_speedup"]


def test_a_cpu_build_on_cores_the_run_already_fills_is_cpu_saturated(tmp_path: Path) -> None:
    # One core, kept busy by the run alone: a worker only moves the same CPU elsewhere.
    report = loop(tmp_path, wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.058, cores=1,
                  cpu_total_pct=100.0, cpu_proc_pct=100.0)
    f = top(report)
    assert f["rule"] == "cpu_saturated"
    assert f["waste_fraction"] == pytest.approx(0.06 * STEPS / report["run"]["duration_s"], rel=0.05)
    assert all("num_workers" not in c for c in configs(f))  # never the 0 that ran
    assert f["data"]["workers_host_alone"] is None  # alone is the same host here


def test_a_build_starved_of_cores_is_called_cpu_bound_and_names_the_crowd(tmp_path: Path) -> None:
    # Seen on the shared box (load 18 on 2 cores): 892 ms a build, 58 ms of it CPU and 833 ms
    # queued for a core. Waiting for a core is not blocked time: the build computes.
    report = loop(tmp_path, wait_s=0.867, compute_s=0.049, build_wall_s=0.892, build_cpu_s=0.058,
                  run_delay_s=0.833, cpu_total_pct=100.0, cpu_proc_pct=7.0,
                  others=[{"name": "python", "pct": 120.0}, {"name": "mypy", "pct": 27.0}])
    f = top(report)
    assert f["rule"] != "io_bound" and f["data"]["build_kind"] == "cpu"
    assert "833 ms waiting for a core" in f["evidence"] and "python (1.2 cores)" in f["evidence"]
    assert f["waste_fraction"] > 0.5


def test_a_quiet_cpu_build_gets_workers_capped_by_the_cores(tmp_path: Path) -> None:
    report = loop(tmp_path, wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.058,
                  cpu_total_pct=50.0, cpu_proc_pct=100.0)
    f = top(report)
    assert f["rule"] == "data_stall"
    # Little's law asks for 3, the two cores give (20 + 58) / 2 = 39 ms: 2 is within 5% of any more
    assert f["data"]["littles_law_workers"] == 3 and f["fix"]["config"]["num_workers"] == 2


def test_no_fix_repeats_the_worker_count_that_ran(tmp_path: Path) -> None:
    # 2 workers ran; the CPU of two cores is the limit, so 2 is already the best count.
    report = loop(tmp_path, wait_s=0.02, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.06, workers=2,
                  cpu_total_pct=100.0, cpu_proc_pct=200.0)
    for f in report["findings"]:
        for c in configs(f):
            assert c.get("num_workers") != 2 and c.get("dataloader_num_workers") != 2
            assert c.get("--num-workers") != 2
    assert "not measured" not in json.dumps(report)


def test_loop_model_and_caps() -> None:
    wait = BuildCost(wall_s=0.1, cpu_s=0.001, thread_cpu_s=0.001, run_delay_s=0.0, in_workers=False)
    m = LoopModel(batch_s=0.12, compute_s=0.02, compute_cpu_s=0.02, build=wait, workers_now=0)
    assert wait.kind == "wait" and m.littles_law(0.02) == 5  # 100 ms a build in a worker / 20 ms a step
    # chosen with 25% headroom: 125 ms / 6 = 21 ms, the compute and CPU floor on one core; predicted as measured
    assert m.choose(cores=1.0, cap=32) == (6, pytest.approx(0.021))
    assert m.choose(cores=1.0, cap=3) == (3, pytest.approx(0.1 / 3))
    # a tokenizer pool starved of cores: the calling thread waits on its pool, not on storage
    starved = BuildCost(wall_s=0.6, cpu_s=0.05, thread_cpu_s=0.005, run_delay_s=0.0, in_workers=False)
    assert starved.pooled and starved.kind == "cpu" and starved.worker_wall_s == pytest.approx(0.05)
    assert worker_cap(1000.0, 500.0, 1, None, None) == (2, "1.0 GiB free at 500 MiB a worker")
    assert worker_cap(None, None, 1, 10, 4) == (3, "the dataset has 3 batches an epoch")


SCRIPT = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        if sys.argv[1] == "sleep":
            time.sleep(0.02)
        else:
            t = time.thread_time()
            while time.thread_time() - t < 0.02: pass
        return torch.zeros(4)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for x in DataLoader(D(), batch_size=2):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("kind", ["sleep", "spin"])
def test_hooks_tell_a_waiting_build_from_a_computing_one(tmp_path: Path, kind: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    subprocess.run([sys.executable, "-m", "gpudoctor", "run", "--no-timing", "--out", str(out), "--", sys.executable,
                    str(script), kind], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for p in (out / "events").glob("*.jsonl") for line in p.read_text().splitlines()]
    fetch = [r for r in rows if r.get("k") == "counter" and r.get("name") == "fetch"]
    assert sum(r["calls"] for r in fetch) == 32 and all("cpu" in r and "rdelay" in r for r in fetch)
    from gpudoctor.analysis import analyze

    p = analyze(load_recording(out)).primary
    assert p is not None and p.fetch_cpu_calls == 32
    build = BuildCost(p.fetch_timed_s / 32, p.fetch_cpu_s / 32, p.fetch_thread_cpu_s / 32, p.fetch_run_delay_s / 32, False)
    assert build.kind == ("wait" if kind == "sleep" else "cpu")
    # --no-timing: the compute is not timed back to back after the training (a build this long would be), and
    # the report says so
    notes = json.loads((out / "report.json").read_text())["notes"]
    assert launcher.not_timed(launcher.NO_TIMING) in notes and not (out / "warm_compute.json").exists()


HOG_SCRIPT = "import ctypes; ctypes.CDLL(None).prctl(15, b'gd-test-hog', 0, 0, 0)\nwhile True: pass"


def test_the_host_sampler_names_a_busy_program_outside_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.recording import JsonlAppender
    from gpudoctor.recording.store import read_jsonl
    from gpudoctor.samplers import HostSampler

    monkeypatch.setattr("gpudoctor.samplers.host.OTHERS_MIN_PCT", 1.0)  # named at any share: a loaded box starves the hog
    hog = subprocess.Popen([sys.executable, "-I", "-c", HOG_SCRIPT])
    patient = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(8)"])
    try:
        sampler = HostSampler(patient.pid, JsonlAppender(tmp_path / "host.jsonl"), interval_s=0.1)
        sampler.start()
        patient.wait()
        sampler.stop()
    finally:
        hog.kill()
        hog.wait()
    rows, _ = read_jsonl(tmp_path / "host.jsonl")
    scans = [r["others"] for r in rows if "others" in r]
    assert scans  # one scan every 3 s over 8 s
    assert any(o["name"] == "gd-test-hog" and o["pct"] >= 10 for scan in scans for o in scan), scans


def test_the_fetching_threads_own_cpu_is_the_builds_not_the_processs() -> None:
    # A storage read of 200 ms while torch's threads spin down after the compute (10 ms of CPU on
    # other threads): the build waited, it did not compute (#40 item 2: "11 ms of CPU, 0 ms blocked")
    storage = BuildCost(wall_s=0.203, cpu_s=0.011, thread_cpu_s=0.001, run_delay_s=0.0, in_workers=False, pool=False)
    assert not storage.pooled and storage.build_cpu_s == pytest.approx(0.001)
    assert storage.blocked_s == pytest.approx(0.202) and storage.kind == "wait"
    assert "1 ms of CPU, 202 ms blocked" in storage.describe()
    # Python formatting on the fetching thread (50 ms) beside the compute's threads (13 ms): never
    # more CPU than wall, and the other threads' CPU is named as theirs
    python = BuildCost(wall_s=0.054, cpu_s=0.063, thread_cpu_s=0.050, run_delay_s=0.0, in_workers=False, pool=False)
    assert python.build_cpu_s == pytest.approx(0.050) and python.kind == "cpu"
    assert python.worker_wall_s == pytest.approx(0.054) and "other threads used 13 ms" in python.describe()
    # a pool that truly works for the build (busy most of its wall) is the build's, with or without a tokenizer
    pool = BuildCost(wall_s=0.06, cpu_s=0.115, thread_cpu_s=0.01, run_delay_s=0.0, in_workers=False, pool=False)
    assert pool.pooled and pool.build_cpu_s == pytest.approx(0.115) and pool.threads == pytest.approx(1.92, abs=0.01)


def test_a_computing_build_of_a_map_style_dataset_leads_with_computing_each_item_once(tmp_path: Path) -> None:
    # 60 ms of Python a batch on the training process, 20 ms of compute, 2 cores: workers would give
    # what the cores allow; computing each item once before training leaves the loop at its compute
    # (#40 item 4: the larger gain first, with its condition; the workers are the alternative)
    report = loop(tmp_path / "cache", wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.06,
                  cpu_total_pct=55.0, cpu_proc_pct=100.0, dataset_len=4096)
    f = top(report)
    assert f["rule"] == "data_stall" and f["data"]["precompute"] == "cache" and f["data"]["dataset_items"] == 4096
    assert f["fix"]["summary"].startswith("Compute each of the 4096 items once before training")
    assert "if an item is the same every epoch (no random augmentation)" in f["fix"]["summary"]
    assert f["data"]["predicted_loop_speedup_cached"] == pytest.approx(0.08 / 0.02, rel=0.02)
    assert f["predicted_speedup"] == pytest.approx(0.08 / 0.02, rel=0.05)  # the wait's seconds, all of them
    wait = [c for c in f["claims"] if c["bucket"] == "data_wait"]
    assert len(wait) == 1 and wait[0]["part"] is None and wait[0]["fraction"] == 1.0  # the tokenizer's part too
    assert f["fix"]["config"] == {} and f["data"]["alternative"]["num_workers"] >= 1
    assert f["data"]["predicted_loop_speedup"] < f["data"]["predicted_loop_speedup_cached"]
    # an iterable dataset (no length) cannot be computed once by index: the workers stay the fix
    stream = top(loop(tmp_path / "stream", wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.06,
                      cpu_total_pct=55.0, cpu_proc_pct=100.0))
    assert stream["rule"] == "data_stall" and "precompute" not in stream["data"]
    assert stream["fix"]["config"]["num_workers"] >= 1
    # a build that waits on storage is io_bound's: workers by Little's law, no cache in its place
    io = top(loop(tmp_path / "io", wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.001,
                  cpu_total_pct=20.0, cpu_proc_pct=20.0, dataset_len=4096))
    assert io["rule"] == "io_bound" and "precompute" not in io["data"]


def test_workers_that_beat_pretokenizing_alone_lead_the_tokenizer_fix(tmp_path: Path) -> None:
    # A 60 ms build of which 20 ms is the tokenizer, 20 ms of compute, 4 cores: pre-tokenizing alone
    # leaves 40 ms of build (80 -> 60 ms a batch), workers hide all of it (-> 20 ms). The larger gain
    # the measurement supports comes first; pre-tokenizing is the alternative (#40 item 4).
    report = loop(tmp_path, wait_s=0.06, compute_s=0.02, build_wall_s=0.06, build_cpu_s=0.06, cores=4,
                  cpu_total_pct=40.0, cpu_proc_pct=100.0, tokenize_s=0.02)
    f = next(x for x in report["findings"] if x["rule"] == "tokenization_in_loop")
    data = f["data"]
    assert data["interim_loop_speedup"] > 1.05 * data["predicted_loop_speedup"]
    assert f["fix"]["config"]["num_workers"] == data["interim_workers"] and f["fix"]["call"] == "DataLoader"
    assert data["alternative_precompute"] == "pretokenize" and "precompute" not in data
    assert "beats pre-tokenizing alone" in f["fix"]["summary"]
    # the promise is the workers' figure: the loop's seconds per batch with them
    assert f["predicted_speedup"] == pytest.approx(data["interim_loop_speedup"], rel=0.05)


@pytest.mark.parametrize(("cores", "rule"), [(2, "data_stall"), (1, "cpu_saturated")])
def test_a_cache_that_also_removes_the_tokenizer_calls_promises_one_figure(tmp_path: Path, cores: int, rule: str) -> None:
    # A 150 ms Python build of a map-style dataset, 15 ms of it tokenizer calls (enough that
    # tokenization_in_loop fires too), 35 ms of compute: computing each item once takes the whole
    # build away, its tokenizer calls with it, whether workers were the alternative (2 cores) or
    # could not help (1 core: cpu_saturated, whose fix is the same cache). The finding's predicted
    # speedup is that one model's figure (the proving ground's loop 15 once said 4.15x in one field,
    # 5.93x in another, and 5.55x under cpu_saturated).
    report = loop(tmp_path, wait_s=0.15, compute_s=0.035, build_wall_s=0.15, build_cpu_s=0.15, cores=cores,
                  cpu_total_pct=55.0 if cores == 2 else 100.0, cpu_proc_pct=100.0, dataset_len=4096, steps=200,
                  tokenize_s=0.015)
    assert {rule, "tokenization_in_loop"} <= {f["rule"] for f in report["findings"]}
    f = next(x for x in report["findings"] if x["rule"] == rule)
    assert f["data"]["precompute"] == "cache"
    if rule == "data_stall":
        assert f["predicted_speedup"] == pytest.approx(f["data"]["predicted_loop_speedup_cached"], rel=0.01)
    assert f["predicted_speedup"] == pytest.approx(0.185 / 0.035, rel=0.05)
    # every claim together never gives back more than the wait: the two findings' claims compound
    assert report["cost"]["wasted_fraction"] <= f["waste_fraction"] + 0.05


@pytest.mark.parametrize(("cores", "rule"), [(2, "data_stall"), (1, "cpu_saturated")])
def test_a_build_that_is_mostly_tokenizer_calls_names_the_tokenizer_first(tmp_path: Path, cores: int, rule: str) -> None:
    # The probe tokenize_in_getitem beside two busy programs: a 150 ms build, 120 ms of it
    # tokenizer calls, of a map-style dataset. Computing each item once is pre-tokenizing here:
    # tokenization_in_loop's finding carries it, and the loader's rule claims only the rest of the
    # wait (it once claimed the whole build, tokenizer calls included, and led with 59% to 51%).
    report = loop(tmp_path, wait_s=0.15, compute_s=0.035, build_wall_s=0.15, build_cpu_s=0.15, cores=cores,
                  cpu_total_pct=55.0 if cores == 2 else 100.0, cpu_proc_pct=100.0, dataset_len=4096, steps=200,
                  tokenize_s=0.12)
    findings = report["findings"]
    assert findings[0]["rule"] == "tokenization_in_loop"
    loader = [f for f in findings if f["rule"] == rule]
    # the rest of the wait (30 ms of 150) is the loader rule's, never the tokenizer's seconds again
    assert all(f["waste_fraction"] < 0.25 for f in loader)
    assert all(f["data"].get("predicted_loop_speedup_cached") is None for f in loader)
