"""What the multi-node merge costs as the job grows (docs/scale.md): recording bytes, merge time, memory.

    python bench/merge_scale.py record [--steps 1500]      # bytes per rank-hour, from a real 2-rank DDP job
    python bench/merge_scale.py merge [--ranks 8 64 512 4096] [--steps 600] [--ranks-per-node 8]

``record`` runs ``probes/ddp_nodes.py`` (torchrun, gloo, one node, 2 ranks) under ``gpudoctor run``
and measures what the run folder holds per rank, per step and per second of sampling.

``merge`` synthesizes run folders in the on-disk format (what ``gpudoctor run`` writes on each node:
one process per rank with a data-wait span and a step line per step, counters, host samples; each
node's clock skewed by up to ±3 s, one slow rank), then times ``gpudoctor report N0 N1 ... -o
merged.json`` (the streaming merge, :mod:`gpudoctor.report.nodes`) in a fresh process per size and
reads its peak RSS. ``--all-at-once`` sizes also load every folder before analysing, as a merge that
concatenated the nodes would: its RSS is what streaming avoids.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000.0
STEP_S = 0.5  # the synthetic job: 2 steps/s per rank, in lockstep
SLOW_RANK = 5


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUDOCTOR_RUN_DIR", None)
    return env


# --- record: bytes per rank-hour from a real job ---------------------------------------------------

def record(steps: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gd-bytes-"))
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    cmd = [sys.executable, "-m", "gpudoctor", "run", "--out", str(tmp / "node0"), "--", torchrun,
           "--nnodes", "1", "--nproc-per-node", "2", str(ROOT / "probes" / "ddp_nodes.py"), "--steps", str(steps)]
    subprocess.run(cmd, check=True, env=_env(), capture_output=True)
    folder = tmp / "node0"
    meta = json.loads((folder / "meta.json").read_text())
    wall_s = meta["end_time"] - meta["start_time"]
    ranks = []
    for path in (folder / "events").glob("*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        n_steps = sum(r.get("k") == "step" for r in rows)
        if n_steps:
            times = [r["t"] for r in rows if r.get("k") == "step"]
            loop_bytes = sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in rows
                             if r.get("k") in ("step", "span", "counter") and r.get("c") != "imports")
            ranks.append({"bytes": path.stat().st_size, "steps": n_steps, "loop_bytes": loop_bytes,
                          "loop_s": max(times) - min(times)})
    samples = sum(p.stat().st_size for p in (folder / "samples").glob("*.jsonl"))
    per_step = sum(r["loop_bytes"] for r in ranks) / sum(r["steps"] for r in ranks)
    fixed = sum(r["bytes"] - r["loop_bytes"] for r in ranks) / len(ranks)
    steps_per_s = sum(r["steps"] / r["loop_s"] for r in ranks) / len(ranks)
    node_per_s = samples / wall_s
    print(f"real job: {len(ranks)} ranks, {ranks[0]['steps']} steps, {steps_per_s:.1f} steps/s, wall {wall_s:.1f} s")
    print(f"per rank: {per_step:.0f} B per step (step line + data-wait span + counters), {fixed / 1024:.1f} KiB once")
    print(f"per node: samples {node_per_s:.0f} B/s ({samples} B over {wall_s:.1f} s; the rate follows the step time, "
          "at most one sample per 0.1 s, at least one per 2 s)")
    for rate in (steps_per_s, 1.0, 10.0):
        rank_hour = per_step * rate * 3600 + fixed
        print(f"  at {rate:5.1f} steps/s: {rank_hour / 2**20:6.1f} MiB per rank-hour of events "
              f"(+ {node_per_s * 3600 / 2**20:.1f} MiB per node-hour of samples at this run's rate)")
    shutil.rmtree(tmp, ignore_errors=True)


# --- merge: synthesized folders -------------------------------------------------------------------

def _line(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def synthesize_node(folder: Path, node: int, ranks: list[int], steps: int, skew_s: float, seed: int) -> None:
    rng = random.Random(seed)
    (folder / "events").mkdir(parents=True, mode=0o700)
    (folder / "samples").mkdir(mode=0o700)
    start = T0 + skew_s
    wall = 20.0 + steps * STEP_S + 2.0
    meta = {"schema": "gpudoctor.run/1", "mode": "run", "command": ["torchrun", "--nnodes", "N", "train.py"],
            "pid": 1000, "start_time": start, "end_time": start + wall, "status": "finished", "exit_code": 0,
            "host": {"hostname": f"node{node}", "cpu_count": 64}, "gpus": [], "nvml_problems": []}
    (folder / "meta.json").write_text(json.dumps(meta))
    ends = [20.0 + (i + 1) * STEP_S + rng.uniform(-0.002, 0.002) for i in range(steps)]  # the collective's
    for local, rank in enumerate(ranks):
        pid = 2000 + local
        wait = 0.3 if rank == SLOW_RANK else 0.02
        out = [_line({"k": "proc", "t": start + 1.0, "pid": pid, "ppid": 1000, "rank": rank, "local_rank": local,
                      "world_size": 0, "argv": ["python", "train.py"], "create_time": start + 0.5,
                      "is_worker": False, "libs": {"torch": "2.13.0"}, "python": "3.11"}),
               _line({"k": "span", "c": "imports", "t0": start + 0.6, "dt": 2.0, "name": "import torch"}),
               _line({"k": "loader", "t": start + 19.0, "id": 1, "num_workers": 4, "batch_size": 8,
                      "pin_memory": True, "prefetch_factor": 2, "persistent_workers": False, "params": []}),
               _line({"k": "first_step", "t": start + 20.0})]
        last_counter = 20.0
        for i, end in enumerate(ends):
            begin = end - STEP_S + 0.001
            out.append(_line({"k": "span", "c": "data_wait", "t0": start + begin, "dt": wait + rng.uniform(0, 0.002),
                              "name": "DataLoader.__next__"}))
            out.append(_line({"k": "step", "t": start + end + rng.uniform(0, 0.003), "n": i + 1, "dt": 0.004}))
            if end - last_counter >= 10.0:
                out.append(_line({"k": "counter", "t": start + end, "name": "fetch", "calls": 20, "s": 0.4}))
                last_counter = end
        out.append(_line({"k": "exit", "t": start + wall - 1.0}))
        (folder / "events" / f"{pid}.jsonl").write_text("".join(out))
    rows = [_line({"t": start + k * 0.5, "cpu_proc_pct": 800.0, "cpu_main_pct": 100.0, "n_procs": 9,
                   "rss_mib": 9000.0, "read_mib_s": 1.0, "write_mib_s": 0.0, "n_cpus": 64,
                   "cpu_percore_pct": [30.0] * 64, "cpu_total_pct": 30.0, "iowait_pct": 0.0,
                   "disk_read_mib_s": 1.0, "disk_write_mib_s": 0.0, "mem_available_mib": 100000.0})
            for k in range(int(wall * 2))]  # 2 Hz: a 0.5 s step at the pace of 1 sample per step
    (folder / "samples" / "host.jsonl").write_text("".join(rows))


def synthesize(root: Path, ranks: int, per_node: int, steps: int) -> list[Path]:
    rng = random.Random(0)
    folders = []
    for node in range(ranks // per_node):
        folder = root / f"node{node:04d}"
        if not folder.exists():
            synthesize_node(folder, node, list(range(node * per_node, (node + 1) * per_node)), steps,
                            0.0 if node == 0 else rng.uniform(-3.0, 3.0), seed=node)
        else:
            rng.uniform(-3.0, 3.0)
        folders.append(folder)
    return folders


def child(folders: list[str], mode: str, out: str) -> None:
    """One size, in its own process: the merge's time and this process's peak RSS."""
    from gpudoctor.commands.load import load_job
    from gpudoctor.recording.store import load_recording
    from gpudoctor.render import renderer_for

    t = time.perf_counter()
    if mode == "all-at-once":
        kept = [load_recording(Path(f)) for f in folders]
        loaded_s = time.perf_counter() - t
        print(json.dumps({"load_s": round(loaded_s, 2), "recordings": len(kept),
                          "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
        return
    report = load_job([Path(f) for f in folders])  # what `gpudoctor report N0 N1 ... -o OUT` runs
    Path(out).write_text(renderer_for(out).render(report))
    merge_s = time.perf_counter() - t
    t = time.perf_counter()
    renderer_for(".html").render(report)
    html_s = time.perf_counter() - t
    nodes = report["nodes"]["nodes"]
    print(json.dumps({"merge_s": round(merge_s, 2), "html_s": round(html_s, 2),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "top": [report["findings"][0]["rule"], report["findings"][0]["data"].get("node"),
                              report["findings"][0]["data"].get("rank")],
                      "aligned": sum(n["clock_offset_s"] is not None for n in nodes), "nodes": len(nodes),
                      "json_mib": round(Path(out).stat().st_size / 2**20, 2)}))


def _expected_skews(n_nodes: int) -> list[float]:
    rng = random.Random(0)
    return [0.0] + [rng.uniform(-3.0, 3.0) for _ in range(n_nodes - 1)]


def merge(sizes: list[int], per_node: int, steps: int, all_at_once: list[int], keep: Path | None) -> None:
    root = keep or Path(tempfile.mkdtemp(prefix="gd-merge-"))
    t = time.perf_counter()
    folders = synthesize(root, max(sizes), per_node, steps)
    disk = sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file())
    print(f"synthesized {len(folders)} node folders x {per_node} ranks x {steps} steps in "
          f"{time.perf_counter() - t:.0f} s: {disk / 2**20:.0f} MiB on disk "
          f"({disk / max(sizes) / 1024:.0f} KiB per rank); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    for n in sizes:
        chosen = [str(f) for f in folders[: n // per_node]]
        out = str(root / f"merged-{n}.json")
        res = _run_child(chosen, "streaming", out)
        skew = json.loads(Path(out).read_text())["nodes"]["nodes"]
        err = max(abs(node["clock_offset_s"] + want) for node, want in zip(skew, _expected_skews(len(skew)), strict=True))
        print(f"{n:5d} ranks ({len(chosen)} folders): merge {res['merge_s']:7.2f} s, html {res['html_s']:5.2f} s, "
              f"peak RSS {res['peak_rss_mib']:7.1f} MiB, report.json {res['json_mib']} MiB; "
              f"top finding {res['top']}; {res['aligned']}/{res['nodes']} nodes aligned, max skew error "
              f"{1000 * err:.1f} ms")
    for n in all_at_once:
        res = _run_child([str(f) for f in folders[: n // per_node]], "all-at-once", "")
        print(f"{n:5d} ranks, every folder loaded at once (no streaming): load {res['load_s']} s, "
              f"peak RSS {res['peak_rss_mib']} MiB")
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def _run_child(folders: list[str], mode: str, out: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "_child", "--mode", mode, "--out", out or "-", *folders],
                          capture_output=True, text=True, env=_env(), check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--steps", type=int, default=1500)
    m = sub.add_parser("merge")
    m.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512, 4096])
    m.add_argument("--ranks-per-node", type=int, default=8)
    m.add_argument("--steps", type=int, default=600, help="steps per rank (0.5 s each: 600 = 5 minutes)")
    m.add_argument("--all-at-once", type=int, nargs="*", default=[64, 512])
    m.add_argument("--keep", type=Path, default=None, help="synthesize here and keep (reused when present)")
    c = sub.add_parser("_child")
    c.add_argument("--mode")
    c.add_argument("--out")
    c.add_argument("folders", nargs="+")
    args = p.parse_args()
    if args.cmd == "record":
        record(args.steps)
    elif args.cmd == "merge":
        merge(args.ranks, args.ranks_per_node, args.steps, args.all_at_once, args.keep)
    else:
        child(args.folders, args.mode, args.out)


if __name__ == "__main__":
    main()
