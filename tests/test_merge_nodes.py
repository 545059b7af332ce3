"""A multi-node job merged into one report: a real two-"node" torchrun on this machine.

Two launches with ``--nnodes 2 --node-rank 0/1`` rendezvous on 127.0.0.1 (gloo), each under its
own ``gpudoctor run --out nodeK/``; rank 1 (on node1) sleeps in its ``__getitem__``. The merge
must name node1 and rank 1, each rank's data wait must match the probe's own timing, and a node
whose clock runs ahead (its folder's times shifted, as a skewed clock would have written them)
must be aligned back on the job's step ends, the skew stated.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.cli import main as cli_main
from gpudoctor.report.check import problem
from tests.conftest import PROBES, ROOT, gpudoctor_cmd, within
from tests.recording_builder import RecordingBuilder

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

SKEW_S = 7.25  # node1's clock, made to run this far ahead
TIME_KEYS = ("t", "t0", "create_time", "start_time", "end_time")
# Rank 1's sleep per item. The straggler rules weigh a rank's wait against the whole run, start-up
# included; at the probe's 15 ms the wait was 20% of a quiet run, and on a loaded machine (slower
# imports and compute, the same sleep) it fell under the rules' 10 points. 40 ms keeps it ~40%.
SLEEP_MS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both nodes' run folders and each rank's truth (one real job, shared by the tests here)."""
    tmp = tmp_path_factory.mktemp("two-nodes")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUDOCTOR_RUN_DIR", None)
    launches = [subprocess.Popen(
        gpudoctor_cmd("run", "--no-timing", "--out", str(tmp / f"node{k}"), "--", torchrun, "--nnodes", "2", "--node-rank", str(k),
                      "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
                      str(PROBES / "ddp_nodes.py"), "--slow-rank", "1", "--sleep-ms", str(SLEEP_MS),
                      "--truth", str(tmp / "truth")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp) for k in (0, 1)]
    errs = [p.communicate(timeout=300)[1] for p in launches]
    assert [p.returncode for p in launches] == [0, 0], errs
    truth = {r: json.loads((tmp / f"truth.rank{r}.json").read_text()) for r in (0, 1)}
    return {"tmp": tmp, "truth": truth}


def _merge(tmp: Path, *folders: Path, out: str = "merged.json") -> dict[str, Any]:
    target = tmp / out
    assert cli_main(["report", *map(str, folders), "-o", str(target)]) == 0
    return json.loads(target.read_text()) if out.endswith(".json") else {"text": target.read_text()}


def _shifted(src: Path, dst: Path, by_s: float) -> Path:
    """``src`` as a node whose clock ran ``by_s`` ahead would have recorded it."""
    shutil.copytree(src, dst)
    for path in [dst / "meta.json", *dst.glob("events/*.jsonl"), *dst.glob("samples/*.jsonl")]:
        if path.suffix == ".json":
            meta = json.loads(path.read_text())
            # the doctor's own readings of its wall clock run ahead too (beside the monotonic one)
            meta["clock"] = [{**r, "t": r["t"] + by_s} for r in meta.get("clock", [])]
            path.write_text(json.dumps({k: v + by_s if k in TIME_KEYS and isinstance(v, float) else v
                                        for k, v in meta.items()}))
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps({k: v + by_s if k in TIME_KEYS and isinstance(v, float) else v
                                            for k, v in row.items()}) + "\n" for row in rows))
    return dst


def test_the_merge_names_the_slow_node_and_rank_and_each_ranks_data_wait_matches_the_probe(job):
    tmp, truth = job["tmp"], job["truth"]
    report = _merge(tmp, tmp / "node0", tmp / "node1")
    assert problem(report) is None
    found = {f["rule"]: f for f in report["findings"]}
    assert "straggler_rank" in found, [(f["rule"], f["waste_fraction"]) for f in report["findings"]]
    slow = found["straggler_rank"]
    assert slow["data"]["node"] == "node1" and slow["data"]["rank"] == 1
    assert "node1" in slow["title"] and "Rank 1" in slow["title"]
    ranks = {r["rank"]: r for r in report["per_rank"]}
    assert {r: ranks[r]["node"] for r in ranks} == {0: "node0", 1: "node1"}
    for r in (0, 1):  # seconds blocked for batches, as each rank timed itself
        assert within(ranks[r]["data_wait_s"], truth[r]["data_wait_s"], abs_pts=0.3), (ranks[r], truth[r])
        assert ranks[r]["steps"]["count"] == truth[r]["steps"]
    nodes = {n["node"]: n for n in report["nodes"]["nodes"]}
    assert nodes["node0"]["ranks"] == [0] and nodes["node1"]["ranks"] == [1]
    assert report["nodes"]["reference"] == "node0"
    assert nodes["node1"]["aligned_steps"] == truth[1]["steps"]
    # one machine, one clock: what the merge corrects is within the step ends' own jitter
    assert abs(nodes["node1"]["clock_offset_s"]) <= nodes["node1"]["step_time_s"]["p50"]


def test_the_fast_ranks_wait_for_the_straggler_is_communication_beside_data_wait_and_compute(job):
    """Rank 0 waits for rank 1 inside DDP's gradient all-reduce: that wait is its communication
    (about rank 1's extra data wait), shown beside data wait and compute per rank and per node."""
    tmp, truth = job["tmp"], job["truth"]
    report = _merge(tmp, tmp / "node0", tmp / "node1")
    ranks = {r["rank"]: r for r in report["per_rank"]}
    extra_wait_s = truth[1]["data_wait_s"] - truth[0]["data_wait_s"]
    assert within(ranks[0]["communication_s"], extra_wait_s, abs_pts=0.3), (ranks[0], extra_wait_s)
    assert ranks[1]["communication_s"] < ranks[0]["communication_s"]
    slow = next(f for f in report["findings"] if f["rule"] == "straggler_rank")
    assert slow["data"]["slow_part"] == "data_wait"
    assert slow["data"]["others_communication_per_step_s"] > slow["data"]["communication_per_step_s"]
    text = _merge(tmp, tmp / "node0", tmp / "node1", out="merged.md")["text"]
    assert "communication share" in text and "compute share" in text


def test_a_node_whose_clock_runs_ahead_is_aligned_on_the_step_ends_and_the_skew_is_stated(job):
    tmp, truth = job["tmp"], job["truth"]
    skewed = _shifted(tmp / "node1", tmp / "skewed" / "node1", SKEW_S)
    report = _merge(tmp, tmp / "node0", skewed, out="skewed.json")
    assert problem(report) is None
    node1 = next(n for n in report["nodes"]["nodes"] if n["node"] == "node1")
    step_s = node1["step_time_s"]["p50"]
    assert abs(node1["clock_offset_s"] + SKEW_S) <= step_s  # what was added to node1's clock
    assert abs(report["nodes"]["skew_corrected_s"] - SKEW_S) <= step_s
    # aligned, the job lasts as long as on the one clock it ran on, not the skew longer (the two
    # launches' own start-up gap, large on a loaded machine, is in both)
    plain = _merge(tmp, tmp / "node0", tmp / "node1", out="plain.json")
    assert abs(report["run"]["duration_s"] - plain["run"]["duration_s"]) <= step_s
    assert next(f for f in report["findings"] if f["rule"] == "straggler_rank")["data"]["node"] == "node1"
    ranks = {r["rank"]: r for r in report["per_rank"]}
    assert within(ranks[1]["data_wait_s"], truth[1]["data_wait_s"], abs_pts=0.3)
    md = _merge(tmp, tmp / "node0", skewed, out="skewed.md")["text"]
    assert "### Nodes" in md and "skew corrected" in md and "node1" in md
    html = _merge(tmp, tmp / "node0", skewed, out="skewed.html")["text"]
    assert "<h2>Nodes</h2>" in html and "skew corrected" in html


def test_the_merge_refuses_what_is_not_one_jobs_run_folders(job, tmp_path, capsys):
    tmp = job["tmp"]
    assert cli_main(["report", str(tmp / "node0"), str(tmp / "node1")]) != 0  # no -o
    assert "-o" in capsys.readouterr().err
    assert cli_main(["report", str(tmp / "node0"), str(tmp / "node0" / "report.json"), "-o", str(tmp_path / "x.md")]) != 0
    assert "not a run folder" in capsys.readouterr().err
    twin = shutil.copytree(tmp / "node0", tmp_path / "twin")
    assert cli_main(["report", str(tmp / "node0"), str(twin), "-o", str(tmp_path / "x.md")]) != 0
    err = capsys.readouterr().err
    assert "rank 0 is in both" in err and len(err.strip().splitlines()) == 1


def _node(root: Path, ranks: list[int], waits: list[float]) -> Path:
    """A node folder of a synthetic job: these ranks, each waiting this long per step, steps in lockstep."""
    b = RecordingBuilder(root, cores=16, duration_s=40.0)
    for pid, (rank, wait) in enumerate(zip(ranks, waits, strict=True), start=100):
        rows = b.process(pid=pid, rank=rank)
        b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.3 - wait, wait_s=wait)
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=200.0)
    b.write()
    return root


def test_a_whole_slow_node_is_straggler_node_and_a_lone_slow_rank_straggler_rank(tmp_path):
    fast = _node(tmp_path / "a" / "nodeA", [0, 1], [0.01, 0.01])
    slow = _node(tmp_path / "b" / "nodeB", [2, 3], [0.12, 0.11])
    report = _merge(tmp_path, fast, slow)
    rules = [f["rule"] for f in report["findings"]]
    assert "straggler_node" in rules and "straggler_rank" not in rules, rules
    node_finding = next(f for f in report["findings"] if f["rule"] == "straggler_node")
    assert node_finding["data"]["node"] == "nodeB" and node_finding["data"]["ranks"] == [2, 3]
    one = _node(tmp_path / "c" / "nodeC", [2, 3], [0.12, 0.01])
    rules = {f["rule"]: f for f in _merge(tmp_path, fast, one, out="one.json")["findings"]}
    assert "straggler_node" not in rules and rules["straggler_rank"]["data"] == {**rules["straggler_rank"]["data"],
                                                                                 "node": "nodeC", "rank": 2}
