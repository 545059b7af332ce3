"""Write recordings in the on-disk format, for rule tests on exact scenarios.

Rules need situations this CPU-only machine cannot produce (an H100 at 30%
busy, 64 cores, iowait): these recordings are what the samplers and hooks
would have written there.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

T0 = 1_700_000_000.0


class RecordingBuilder:
    def __init__(self, root: Path, *, cores: int = 8, duration_s: float = 100.0) -> None:
        self.root = root
        self.cores = cores
        self.duration_s = duration_s
        self.events: dict[int, list[dict[str, Any]]] = {}
        self.host: list[dict[str, Any]] = []
        self.gpu: list[dict[str, Any]] = []
        self.gpus_meta: list[dict[str, Any]] = []
        self.meta_extra: dict[str, Any] = {}

    def process(self, pid: int = 100, rank: int | None = None, libs: dict[str, str] | None = None,
                is_worker: bool = False, ppid: int = 1) -> list[dict[str, Any]]:
        rows = self.events.setdefault(pid, [])
        rows.append({"k": "proc", "t": T0, "pid": pid, "ppid": ppid, "rank": rank, "is_worker": is_worker,
                     "libs": libs or {"torch": "2.13.0"}, "argv": ["python", "train.py"]})
        return rows

    def training_loop(self, rows: list[dict[str, Any]], *, start_s: float, steps: int, compute_s: float,
                      wait_s: float, fetch_s: float | None = None, num_workers: int = 0, batch_size: int = 8,
                      save_every: int = 0, save_s: float = 0.0, trainer_args: dict[str, Any] | None = None,
                      jitter_s: float = 0.0, seed: int = 0, dataset_len: int | None = None) -> float:
        """Steps of (wait for batch, compute, optional save); returns the end time offset.

        ``dataset_len``: the loader's dataset has a length (a map-style dataset); None: an iterable one.

        ``jitter_s`` adds a seeded uniform +-jitter_s to each step's compute, as a real loop has.
        """
        rng = random.Random(seed)
        rows.append({"k": "loader", "t": T0 + start_s, "id": 1, "num_workers": num_workers, "batch_size": batch_size,
                     "pin_memory": False, "prefetch_factor": None, "persistent_workers": False,
                     "params": ["dataset", "batch_size", "num_workers", "pin_memory", "prefetch_factor",
                                "persistent_workers"], **({"dataset_len": dataset_len} if dataset_len else {})})
        if trainer_args is not None:
            rows.append({"k": "trainer", "t": T0 + start_s, "args": trainer_args, "version": "5.23.0",
                         "max_steps": trainer_args.get("max_steps"), "num_train_epochs": 1})
        rows.append({"k": "first_step", "t": T0 + start_s})
        t = start_s
        for n in range(1, steps + 1):
            rows.append({"k": "span", "c": "data_wait", "t0": T0 + t, "dt": wait_s, "name": "DataLoader.__next__"})
            t += wait_s + compute_s + (rng.uniform(-jitter_s, jitter_s) if jitter_s else 0.0)
            rows.append({"k": "step", "t": T0 + t, "n": n, "dt": 0.001})
            if save_every and n % save_every == 0:
                rows.append({"k": "span", "c": "checkpoint", "t0": T0 + t, "dt": save_s, "name": "torch.save"})
                t += save_s
        if fetch_s is not None:
            rows.append({"k": "counter", "t": T0 + t, "name": "fetch", "calls": steps, "s": fetch_s * steps})
        return t

    def tokenizer_counters(self, rows: list[dict[str, Any]], *, start_s: float, end_s: float, total_s: float,
                           every_s: float = 0.5) -> None:
        """Tokenizer time on this process, flushed every ``every_s`` as the hooks do."""
        flushes = max(1, int((end_s - start_s) / every_s))
        for i in range(1, flushes + 1):
            rows.append({"k": "counter", "t": T0 + start_s + i * (end_s - start_s) / flushes, "name": "tokenize",
                         "calls": 10, "s": total_s / flushes})

    def fetch_counter(self, rows: list[dict[str, Any]], *, t_s: float, calls: int, wall_s: float, cpu_s: float,
                      run_delay_s: float = 0.0, thread_cpu_s: float | None = None) -> None:
        """Batch builds as the hooks time them: per batch ``wall_s`` of which ``cpu_s`` process CPU
        (every thread; ``thread_cpu_s`` the calling thread's, default as much as its wall allows)
        and ``run_delay_s`` waiting for a core; the rest was blocked (I/O, sleep)."""
        tcpu = min(cpu_s, wall_s) if thread_cpu_s is None else thread_cpu_s
        rows.append({"k": "counter", "t": T0 + t_s, "name": "fetch", "calls": calls, "s": wall_s * calls,
                     "cpu": cpu_s * calls, "tcpu": tcpu * calls, "rdelay": run_delay_s * calls})

    def host_rows(self, *, cpu_total_pct: float, cpu_proc_pct: float, iowait_pct: float = 0.0,
                  others: list[dict[str, Any]] | None = None) -> None:
        """Host samples at 10 Hz; ``others`` ([{"name", "pct"}], the busiest other programs) every 3 s."""
        for i in range(int(self.duration_s * 10)):
            row = {"t": T0 + i / 10, "cpu_total_pct": cpu_total_pct, "cpu_proc_pct": cpu_proc_pct,
                   "iowait_pct": iowait_pct, "rss_mib": 2000.0, "read_mib_s": 5.0,
                   "cpu_percore_pct": [cpu_total_pct] * self.cores, "mem_available_mib": 60000.0}
            if others is not None and i % 30 == 29:
                row["others"] = others
            self.host.append(row)

    def gpu_rows(self, *, util_pct: float, mem_used_mib: float, name: str = "NVIDIA H100 80GB HBM3",
                 mem_total_mib: float = 81559.0, count: int = 1) -> None:
        self.gpus_meta = [{"index": i, "name": name, "memory_total_mib": mem_total_mib} for i in range(count)]
        for i in range(int(self.duration_s * 10)):
            self.gpu.append({"t": T0 + i / 10, "gpus": [
                {"index": g, "name": name, "util_pct": util_pct, "mem_used_mib": mem_used_mib,
                 "mem_total_mib": mem_total_mib, "proc_mem_mib": mem_used_mib, "lost": False}
                for g in range(count)]})

    def write(self) -> Path:
        (self.root / "samples").mkdir(parents=True, exist_ok=True)
        (self.root / "events").mkdir(parents=True, exist_ok=True)
        meta = {"schema": "gpudoctor.run/1", "mode": "run", "command": ["python", "train.py"], "pid": 100,
                "start_time": T0, "end_time": T0 + self.duration_s, "status": "finished", "exit_code": 0,
                "host": {"cpu_count": self.cores}, "gpus": self.gpus_meta, "nvml_problems": [],
                **self.meta_extra}
        (self.root / "meta.json").write_text(json.dumps(meta))
        _jsonl(self.root / "samples" / "host.jsonl", self.host)
        _jsonl(self.root / "samples" / "gpu.jsonl", self.gpu)
        for pid, rows in self.events.items():
            _jsonl(self.root / "events" / f"{pid}.jsonl", rows)
        return self.root


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
