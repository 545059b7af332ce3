"""``gpudoctor sweep`` end to end on CPU: real replay trials, each its own process.

The config reads every example from "slow storage" (``replay.read_latency_ms``) and
tokenizes it in ``__getitem__``, so DataLoader workers genuinely help even on a
2-core box. One real sweep (3 trials) feeds the cache; the repeated, sharded and
adaptive sweeps then run from it, which also makes their timings identical.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

WINDOW = (
    "--warmup-s",
    "1.5",
    "--window-s",
    "1",
    "--windows",
    "3",
    "--noise",
    "0.25",
    "--repeats",
    "1",
)
GRID = ("--grid", "dataloader_num_workers=0,1,2")


class Sweeps:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "slow_loading.yaml"
        shutil.copy(ROOT / "sample_configs" / "slow_loading.yaml", self.config)
        self.cache = root / "trials"
        # A Ray token in ~/.ray (any earlier ray.init on this machine leaves one) turns token auth
        # on for the test's head but not for the client joining it: keep the loopback head open.
        self.env = {"GPUDOCTOR_REPLAY_CACHE": str(root / "replay-cache"), "RAY_AUTH_MODE": "disabled"}

    def run(self, name: str, *args: str, config: bool = True) -> tuple[Any, dict[str, Any] | None]:
        out = self.root / name
        head = (str(self.config),) if config else ()
        proc = run_cli(
            "sweep",
            *head,
            "--out",
            str(out),
            "--cache",
            str(self.cache),
            *WINDOW,
            *args,
            env=self.env,
            timeout=400,
        )
        path = out / "sweep.json"
        return proc, json.loads(path.read_text()) if path.exists() else None

    def trial_folders(self) -> int:
        return len(list(self.cache.glob("*/run-*")))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> Sweeps:
    return Sweeps(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def workers_sweep(sweeps: Sweeps) -> dict[str, Any]:
    proc, doc = sweeps.run("workers", *GRID)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert doc is not None
    return doc


def _by_workers(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["params"]["training.dataloader_num_workers"]: p for p in doc["points"]}


def _structure(doc: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on how the sweep was split: points, winner, change."""
    points = [{k: v for k, v in p.items() if k != "cached"} for p in doc["points"]]
    change = {k: v for k, v in (doc["change"] or {}).items() if k != "command"}
    return {"points": points, "best": doc["best"], "change": change}


def test_more_workers_win_when_loading_is_slow(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    points = _by_workers(workers_sweep)
    assert all(p["status"] == "ok" for p in points.values()), [p["reason"] for p in points.values()]
    speed = {w: p["metrics"]["samples_per_s"] for w, p in points.items()}
    assert speed[1] > 1.2 * speed[0] and speed[2] > 1.2 * speed[0], speed
    wait = {w: p["metrics"]["data_wait_share"] for w, p in points.items()}
    assert wait[0] > wait[2] and wait[0] > 0.3, wait
    best = workers_sweep["best"]
    assert (
        best["params"]["training.dataloader_num_workers"] > 0 and best["speedup_vs_current"] > 1.2
    )
    winner = best["params"]["training.dataloader_num_workers"]
    assert f"+  dataloader_num_workers: {winner}" in workers_sweep["change"]["yaml_diff"]
    assert workers_sweep["change"]["training_arguments"] == {"dataloader_num_workers": winner}
    for p in points.values():  # per-point figures
        m = p["metrics"]
        assert m["nonpad_tokens_per_s"] > m["samples_per_s"] > 0 and m["step_time_s"] > 0
        assert m["peak_rss_mib"] > 50 and m["gpu_busy"] is None
        cost = p["cost"]  # the measured speed at the config's $0.80/h; preflight's L4 run beside
        assert cost["usd_per_mtok"] == pytest.approx(0.80 / 3600 / m["nonpad_tokens_per_s"] * 1e6)
        assert cost["run_usd"] > 0 and "L4" in cost["predicted"]["target"]
    folder = sweeps.root / "workers"
    html = (folder / "sweep.html").read_text()
    assert "<svg" in html and "★" in html and "dataloader_num_workers=" in html
    assert "dataloader_num_workers" in (folder / "sweep.md").read_text()
    assert f"dataloader_num_workers: {winner}" in (folder / "best.yaml").read_text()


def test_a_repeated_sweep_runs_no_new_trial(workers_sweep: dict[str, Any], sweeps: Sweeps) -> None:
    before = sweeps.trial_folders()
    proc, doc = sweeps.run("again", *GRID)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc is not None and doc["trials_run"] == 0 and sweeps.trial_folders() == before
    assert all(p["cached"] for p in doc["points"])
    assert _structure(doc) == _structure(workers_sweep)


def test_shards_merge_into_the_unsharded_result(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    docs = [sweeps.run(f"shard{i}", *GRID, "--shard", f"{i}/2")[1] for i in range(2)]
    assert all(d is not None for d in docs)
    assert sorted(len(d["points"]) for d in docs if d) == [1, 2]
    proc, merged = sweeps.run(
        "merged", "--merge", str(sweeps.root / "shard0"), str(sweeps.root / "shard1"), config=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert merged is not None and _structure(merged) == _structure(workers_sweep)


def test_adaptive_reports_trials_used_and_the_same_winner(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    proc, doc = sweeps.run("adaptive", *GRID, "--adaptive")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert doc is not None
    a = doc["adaptive"]
    assert a["grid_points"] == 3 and 1 <= a["trials_used"] <= 3
    assert a["full_grid_known"] and a["same_winner"] is True
    assert doc["best"]["index"] == workers_sweep["best"]["index"]
    assert "trials of 3" in proc.stderr


def test_a_hanging_trial_times_out_and_the_sweep_keeps_the_rest(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    # 60 s per example: the first batch never comes. read_latency_ms=5 is the config as is (cached).
    proc, doc = sweeps.run("hang", "--grid", "read_latency_ms=5,60000", "--trial-timeout", "6")
    assert doc is not None, proc.stderr[-2000:]
    status = {p["params"]["replay.read_latency_ms"]: p for p in doc["points"]}
    assert status[5.0]["status"] == "ok" and status[5.0]["cached"]
    assert status[60000.0]["status"] == "timeout" and "--trial-timeout" in status[60000.0]["reason"], status[60000.0]
    assert proc.returncode == 0 and doc["best"]["params"]["replay.read_latency_ms"] == 5.0


def test_preparing_past_the_trial_timeout_is_a_timeout_not_a_crash(tmp_path: Path, monkeypatch) -> None:
    """A busy machine can spend the whole --trial-timeout importing and building the data cache."""
    from gpudoctor.sweep.trial import prepare

    monkeypatch.setenv("GPUDOCTOR_REPLAY_CACHE", str(tmp_path / "cache"))
    failed = prepare(ROOT / "sample_configs" / "healthy.yaml", 0.001)  # no interpreter starts that fast
    assert failed is not None and failed.status == "timeout", failed
    assert failed.reason == "preparing the data took longer than --trial-timeout 0.001 s"


def test_a_crashing_trial_is_recorded_and_the_sweep_goes_on(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    # The model is 32 wide: 3 heads cannot split it, the worker exits with the model's error.
    proc, doc = sweeps.run("crash", "--grid", "model.config.n_head=2,3")
    assert doc is not None, proc.stderr[-2000:]
    crashed = next(p for p in doc["points"] if p["params"]["model.config.n_head"] == 3)
    assert crashed["status"] == "crashed" and "divisible" in crashed["reason"]
    # The trial's YAML lives in the cache: its path is not the user's business.
    assert "/trials/" not in crashed["reason"]
    assert proc.returncode == 0 and doc["best"]["params"]["model.config.n_head"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no --grid given"),
        (("--grid", "per_device_train_batch_size=2,two"), "must be a whole number"),
        (("--grid", "dataloader_num_workrs=0,1"), "did you mean training.dataloader_num_workers"),
        (("--grid", "per_device_train_batch_size=1,2,3,4", "--max-trials", "2"), "--max-trials 2"),
        (("--grid", "dataloader_num_workers=0,1", "--shard", "2/2"), "0 <= I < N"),
        (
            ("--grid", "dataloader_num_workers=0,1", "--adaptive", "--shard", "0/2"),
            "cannot be sharded",
        ),
        (("--grid", "dataloader_num_workers=0,1", "--target", "tpu-v9"), "unknown target GPU"),
        (("--grid", "dataloader_num_workers=0,1", "--ray-address", "auto"), "--backend ray"),
        (("--grid", "dataloader_num_workers=0,1", "--adaptive", "--emit-slurm", "x"), "drop --adaptive"),
        (("--grid", "dataloader_num_workers=0,1", "--study-storage", "sqlite:///s.db"), "add --adaptive"),
    ],
)
def test_bad_input_is_one_clear_line_before_any_trial(
    args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpudoctor.cli import main

    config = ROOT / "sample_configs" / "slow_loading.yaml"
    code = main(
        [
            "sweep",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--cache",
            str(tmp_path / "c"),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "c").exists()  # nothing ran


def _shape(doc: dict[str, Any]) -> dict[str, Any]:
    """The keys a reader of sweep.json relies on, whatever ran the trials."""
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    return {
        "doc": sorted(doc),
        "point": sorted({k for p in doc["points"] for k in p}),
        "metrics": sorted({k for p in ok for k in p["metrics"]}),
        "cost": sorted({k for p in ok for k in p["cost"]}),
        "best": sorted(doc["best"] or {}),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory, sweeps: Sweeps) -> Iterator[str]:
    """A real Ray head (2 CPUs, a small object store), started here and stopped after.

    ``--block`` keeps ``ray start`` in front of its processes: stopping it stops them (no
    ``ray stop``, which would stop every Ray of the machine). The temp dir is under
    pytest's when its socket paths fit the 107-byte limit of a Unix socket.
    """
    temp = tmp_path_factory.mktemp("ray")
    if len(str(temp)) > 40:
        temp = Path(tempfile.mkdtemp(prefix="gdray", dir="/tmp"))
    port = _free_port()
    env = {
        **os.environ,
        **sweeps.env,
        "PYTHONPATH": str(ROOT),  # the trial tasks import gpudoctor on the "node"
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    ports = [
        "--port", str(port), "--ray-client-server-port", str(_free_port()),
        "--dashboard-agent-listen-port", str(_free_port()),
        "--dashboard-agent-grpc-port", str(_free_port()),
        "--metrics-export-port", str(_free_port()), "--runtime-env-agent-port", str(_free_port()),
        "--dashboard-port", str(_free_port()),
    ]  # fmt: skip
    log = open(temp / "head.log", "wb")  # noqa: SIM115 - read while the head runs
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         "--num-cpus", "2", "--num-gpus", "0", "--object-store-memory", str(80 * 2**20),
         "--include-dashboard", "false", "--disable-usage-stats",
         "--node-ip-address", "127.0.0.1", "--temp-dir", str(temp), *ports],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(240):
            if b"--block" in (temp / "head.log").read_bytes() or head.poll() is not None:
                break
            time.sleep(0.5)
        text = (temp / "head.log").read_text(errors="replace")
        assert head.poll() is None, text[-3000:]
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # whatever it left, in the session it led
        log.close()


def test_a_sweep_on_a_ray_head_has_the_local_shape_and_records_a_crash(
    ray_head: str, workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    cache = sweeps.root / "ray-trials"
    proc, doc = sweeps.run(
        "ray",
        "--grid", "dataloader_num_workers=1", "--grid", "model.config.n_head=2,3",
        "--backend", "ray", "--ray-address", ray_head, "--cache", str(cache),
    )  # fmt: skip
    assert proc.returncode == 0 and doc is not None, proc.stderr[-3000:]
    by = {p["params"]["model.config.n_head"]: p for p in doc["points"]}
    assert len(by) == 2
    # n_head=3 cannot split the 32-wide model: recorded, not fatal; n_head=2 trains, a DataLoader
    # worker of its own inside the Ray task
    assert by[3]["status"] == "crashed" and "divisible" in by[3]["reason"]
    ok = by[2]
    assert ok["status"] == "ok", ok["reason"]
    assert ok["metrics"]["samples_per_s"] > 0 and ok["metrics"]["peak_rss_mib"] > 50
    # One trial a point, and one more for a point measured noisy (CI saw 5 for 4): each left its run.
    runs = sum(len(list((cache / p["key"]).glob("run-*"))) for p in doc["points"])
    assert doc["backend"]["name"] == "ray" and doc["trials_run"] == runs >= 2
    assert _shape(doc) == _shape(workers_sweep)
    # What the task measured landed in the driver's own cache, as a local trial leaves it.
    run = next((cache / ok["key"]).glob("run-*"))
    assert (run / "worker.log").stat().st_size > 0
    assert json.loads((run / "replay_measure.json").read_text())["device"] == "cpu"


def test_emit_slurm_writes_an_array_whose_tasks_and_merge_give_the_grid(
    workers_sweep: dict[str, Any], sweeps: Sweeps
) -> None:
    folder = sweeps.root / "slurm"
    proc, _ = sweeps.run("unused", *GRID, "--emit-slurm", str(folder))
    assert proc.returncode == 0, proc.stderr[-2000:]
    array = (folder / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-2" in array and "#SBATCH --cpus-per-task=3" in array
    assert '--shard "$SLURM_ARRAY_TASK_ID/3"' in array and str(sweeps.cache) in array
    assert "--dependency=afterany" in (folder / "submit.sh").read_text()
    env = {**os.environ, **sweeps.env, "PYTHONPATH": str(ROOT)}
    for task in range(3):  # what Slurm would do: one task per point, then the merge
        done = subprocess.run(["bash", str(folder / "sweep.sbatch")], capture_output=True,
                              text=True, env={**env, "SLURM_ARRAY_TASK_ID": str(task)}, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    missing = subprocess.run(["bash", str(folder / "sweep.sbatch")], capture_output=True,
                             text=True, env=env, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "SLURM_ARRAY_TASK_ID" in missing.stderr
    merged = subprocess.run(["bash", str(folder / "merge.sbatch")], capture_output=True,
                            text=True, env=env, timeout=300)  # fmt: skip
    assert merged.returncode == 0, merged.stderr[-2000:]
    doc = json.loads((folder / "merged" / "sweep.json").read_text())
    assert len(doc["merged_from"]) == 3 and _structure(doc) == _structure(workers_sweep)


def test_a_trial_clearly_slower_in_its_first_window_is_stopped_there(
    workers_sweep: dict[str, Any], sweeps: Sweeps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudoctor.sweep.protocol import Protocol
    from gpudoctor.sweep.trial import run_trial
    from gpudoctor.sweep.windows import read_trial

    monkeypatch.setenv("GPUDOCTOR_REPLAY_CACHE", sweeps.env["GPUDOCTOR_REPLAY_CACHE"])
    key = _by_workers(workers_sweep)[0]["key"]
    told: list[tuple[int, float]] = []

    def watch(windows: int, samples_per_s: float) -> bool:  # what --adaptive's pruner is asked
        told.append((windows, samples_per_s))
        return True

    protocol = Protocol(1.5, 1.0, 3, 1)
    run = run_trial(sweeps.cache / key / "config.yaml", tmp_path, protocol, 120, 8, None, watch)
    assert run.status == "pruned" and "after 1 window" in (run.reason or "")
    assert len(told) == 1 and told[0][0] == 1 and told[0][1] > 0
    whole = next((sweeps.cache / key).glob("run-*/events/*.jsonl"))
    full = read_trial(whole.parent.parent, int(whole.stem)).batch_count
    stopped = read_trial(tmp_path, int(next(tmp_path.glob("events/*.jsonl")).stem)).batch_count
    assert 0 < stopped < full  # stopped a window in, not run to the end
