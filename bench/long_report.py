"""Bench: build and render the report of a 24-hour, 10 Hz recording.

Generates a synthetic run folder (host and 8-GPU samples at ``--hz`` for
``--hours``, plus a training process and two DataLoader workers emitting what
the hooks emit: a step and a data wait every ~0.5 s, fetch/tokenize counters
as often as the EventWriter writes them, padding for every 10th batch, a checkpoint every 30 min and an
evaluation every 2 h), then, in a fresh subprocess, times ``load_recording`` +
``build_report`` + rendering JSON/HTML/Markdown and reads that process's peak
RSS. Targets (issue 6): < 3 s and < 500 MB.

    python bench/long_report.py                   # 24 h at 10 Hz, 8 GPUs
    python bench/long_report.py --hours 1 --keep /tmp/run1h
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpudoctor.hooks.writer import COUNTER_MAX_PERIOD_S

T0 = 1_700_000_000.0
STEP_S = 0.5
GPU_NAME = "NVIDIA H100 80GB HBM3"


def _host_line(t: float, rnd: random.Random, cores: int) -> str:
    busy = [round(rnd.uniform(20, 90), 1) for _ in range(cores)]
    return json.dumps({
        "t": round(t, 3), "cpu_proc_pct": round(rnd.uniform(150, 400), 1), "cpu_main_pct": 99.0,
        "procs": {"1000": 99.0, "1001": 80.0, "1002": 85.0}, "n_procs": 3,
        "rss_mib": round(rnd.uniform(9000, 12000), 1), "read_mib_s": 1.5, "write_mib_s": 0.2,
        "n_cpus": cores, "cpu_percore_pct": busy, "cpu_total_pct": round(sum(busy) / cores, 1),
        "iowait_pct": 0.4, "disk_read_mib_s": 2.0, "disk_write_mib_s": 0.5, "mem_available_mib": 400000.0,
    }, separators=(",", ":"))


def _gpu_line(t: float, rnd: random.Random, n_gpus: int) -> str:
    gpus = [
        f'{{"index":{i},"name":"{GPU_NAME}","util_pct":{rnd.randint(60, 100)}.0,'
        f'"mem_used_mib":{rnd.uniform(60000, 70000):.1f},"mem_total_mib":81559.0,"power_w":{rnd.uniform(300, 700):.1f},'
        f'"sm_clock_mhz":1980,"pcie_tx_kib_s":null,"pcie_rx_kib_s":null,"proc_mem_mib":{rnd.uniform(59000, 69000):.1f},'
        f'"lost":false}}'
        for i in range(n_gpus)
    ]
    return f'{{"t":{t:.3f},"gpus":[{",".join(gpus)}]}}'


def write_samples(root: Path, hours: float, hz: float, n_gpus: int, cores: int, seed: int) -> None:
    rnd = random.Random(seed)
    n = int(hours * 3600 * hz)
    with open(root / "samples/host.jsonl", "w") as host, open(root / "samples/gpu.jsonl", "w") as gpu:
        for chunk in range(0, n, 10_000):
            ts = [T0 + i / hz for i in range(chunk, min(n, chunk + 10_000))]
            host.write("".join(_host_line(t, rnd, cores) + "\n" for t in ts))
            gpu.write("".join(_gpu_line(t, rnd, n_gpus) + "\n" for t in ts))


def _main_events(hours: float, rnd: random.Random) -> list[str]:
    end = T0 + hours * 3600
    ev: list[dict] = [
        {"k": "proc", "t": T0 + 1, "pid": 1000, "ppid": 1, "rank": 0, "local_rank": 0, "world_size": 8,
         "argv": ["python", "train.py", "--hf-token", "***"], "create_time": T0, "is_worker": False,
         "libs": {"torch": "2.13.0", "transformers": "5.23.0"}, "python": "3.11.7"},
        {"k": "loader", "t": T0 + 60, "id": 1, "num_workers": 2, "batch_size": 8, "pin_memory": True,
         "prefetch_factor": 2, "persistent_workers": False, "dataset": "Dataset", "collate_fn": "collate",
         "params": ["dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers"]},
        {"k": "first_step", "t": T0 + 60},
        {"k": "torch_cfg", "t": T0 + 60.1, "cuda": True, "device": "cuda", "device_name": GPU_NAME,
         "device_capability": [9, 0], "matmul_precision": "high", "allow_tf32": True, "cudnn_allow_tf32": True,
         "param_dtype": "torch.float32", "autocast": True, "autocast_dtype": "torch.bfloat16", "module": "GPT2",
         "libs": {"torch": "2.13.0"}},
    ]
    t, n, batches, next_ckpt, next_eval, next_flush = T0 + 60, 0, 0, T0 + 1800, T0 + 7200, T0 + 60.5
    lines = [json.dumps(e, separators=(",", ":")) for e in ev]
    while t < end:
        wait = rnd.uniform(0.005, 0.06)
        lines.append(f'{{"k":"span","c":"data_wait","t0":{t:.6f},"dt":{wait:.6f},"name":"DataLoader.__next__"}}')
        batches += 1
        if batches <= 50 or batches % 10 == 0:
            lengths = [rnd.randint(40, 512) for _ in range(8)]
            lines.append(json.dumps({"k": "batch", "t": round(t, 6), "tokens": 4096, "pad": 4096 - sum(lengths),
                                     "seq_len": 512, "lengths": lengths}, separators=(",", ":")))
        t += STEP_S * rnd.uniform(0.9, 1.1)
        n += 1
        lines.append(f'{{"k":"step","t":{t:.6f},"n":{n},"dt":0.004}}')
        if t >= next_flush:
            lines.append(f'{{"k":"counter","t":{t:.6f},"name":"tokenize","calls":8,"s":0.002}}')
            next_flush = t + _counter_period(t - T0)
        if t >= next_ckpt:
            lines.append(f'{{"k":"span","c":"checkpoint","t0":{t:.6f},"dt":20.0,"name":"torch.save"}}')
            t, next_ckpt = t + 20.0, next_ckpt + 1800
        if t >= next_eval:
            lines.append(f'{{"k":"span","c":"eval","t0":{t:.6f},"dt":60.0,"name":"Trainer.evaluate"}}')
            t, next_eval = t + 60.0, next_eval + 7200
    lines.append(f'{{"k":"exit","t":{end:.6f}}}')
    return lines


def _worker_events(pid: int, hours: float) -> list[str]:
    lines = [json.dumps({"k": "proc", "t": T0 + 61, "pid": pid, "ppid": 1000, "rank": 0, "is_worker": True,
                         "argv": ["python", "train.py"], "libs": {"torch": "2.13.0"}}, separators=(",", ":"))]
    born = t = T0 + 61.0
    end = T0 + hours * 3600
    while t < end:
        period = _counter_period(t - born)
        lines.append(f'{{"k":"counter","t":{t:.6f},"name":"fetch","calls":{round(2 * period)},"s":{0.42 * period:.4f}}}')
        lines.append(f'{{"k":"counter","t":{t:.6f},"name":"tokenize","calls":{round(16 * period)},"s":{0.24 * period:.4f}}}')
        t += period
    return lines


def _counter_period(age_s: float) -> float:
    """How often the EventWriter writes counter lines at this process age (see hooks/writer.py)."""
    return min(COUNTER_MAX_PERIOD_S, max(0.5, age_s / 60))


def generate(root: Path, hours: float, hz: float, n_gpus: int, cores: int, seed: int = 0) -> None:
    for sub in ("samples", "events"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    meta = {"schema": "gpudoctor.run/1", "mode": "attach", "command": ["python", "train.py"], "pid": 1000,
            "started_at": "2023-11-14T22:13:20+00:00", "start_time": T0, "end_time": T0 + hours * 3600,
            "status": "finished", "exit_code": 0,
            "host": {"hostname": "bench", "cpu_count": cores, "memory_total_mib": 2_000_000},
            "gpus": [{"index": i, "name": GPU_NAME, "memory_total_mib": 81559.0} for i in range(n_gpus)],
            "nvml_problems": [], "price_per_gpu_hour": 3.0, "gpus_option": None, "gpudoctor_version": "bench"}
    (root / "meta.json").write_text(json.dumps(meta))
    rnd = random.Random(seed)
    (root / "events/1000.jsonl").write_text("\n".join(_main_events(hours, rnd)) + "\n")
    for pid in (1001, 1002):
        (root / f"events/{pid}.jsonl").write_text("\n".join(_worker_events(pid, hours)) + "\n")
    write_samples(root, hours, hz, n_gpus, cores, seed)


_MEASURE = r"""
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
c0 = time.process_time()
from gpudoctor.recording.store import load_recording
from gpudoctor.render import renderer_for
from gpudoctor.report.build import build_report
t_import = time.perf_counter()
c_import = time.process_time()
rec = load_recording(Path(sys.argv[1]))
t_load = time.perf_counter()
report = build_report(rec)
t_build = time.perf_counter()
sizes = {ext: len(renderer_for(ext).render(report)) for ext in ("json", "html", "md")}
t_render = time.perf_counter()
cpu_s = time.process_time() - c_import
print(json.dumps({"cpu_s": cpu_s, "import_s": t_import - t0, "load_s": t_load - t_import, "build_s": t_build - t_load,
                  "render_s": t_render - t_build, "total_s": t_render - t_import,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "host_rows_used": len(rec.host), "gpu_rows_used": len(rec.gpu), "sizes": sizes,
                  "notes": report["notes"], "breakdown": report["breakdown"], "steps": report["steps"]["count"]}))
"""


def measure(root: Path) -> dict:
    """Time load + build + render in a fresh interpreter (so peak RSS is this work's alone)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(root)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--cores", type=int, default=64)
    p.add_argument("--keep", type=Path, default=None, help="write the run folder here and keep it")
    p.add_argument("--reuse", action="store_true", help="measure an existing --keep folder, do not regenerate")
    args = p.parse_args()
    tmp = None
    root = args.keep
    if root is None:
        tmp = tempfile.mkdtemp(prefix="gpudoctor-bench-")
        root = Path(tmp)
    try:
        if not (args.reuse and (root / "meta.json").exists()):
            g0 = time.perf_counter()
            generate(root, args.hours, args.hz, args.gpus, args.cores)
            size_mib = sum(f.stat().st_size for f in root.rglob("*.jsonl")) / 2**20
            print(f"generated {args.hours:g} h at {args.hz:g} Hz, {args.gpus} GPUs: {size_mib:.0f} MiB of JSON lines "
                  f"in {time.perf_counter() - g0:.1f} s ({root})", file=sys.stderr)
        r = measure(root)
        ok = r["total_s"] < 3.0 and r["peak_rss_mib"] < 500
        print(f"load {r['load_s']:.2f} s + build_report {r['build_s']:.2f} s + render {r['render_s']:.2f} s "
              f"= {r['total_s']:.2f} s wall ({r['cpu_s']:.2f} s CPU; imports {r['import_s']:.2f} s more); "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB "
              f"(host rows used {r['host_rows_used']}, gpu rows used {r['gpu_rows_used']}, steps {r['steps']}) "
              f"-> {'OK' if ok else 'OVER TARGET'} (< 3 s, < 500 MB)")
        print(f"breakdown {r['breakdown']}", file=sys.stderr)
        return 0 if ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
