"""The report fixtures, built by ``build_report`` from recordings (tests/recording_builder.py).

``python -m tests.report_fixtures`` rewrites tests/data/report_sample.json and
report_nogpu.json from the code as it is, so the renderers' tests read what build_report
writes today (rules, claims, fix tables, profiler windows), not a hand-written file.
tests/data/report_before_claims.json stays hand-written on purpose: a report from before
findings carried ``claims`` and fixes named their ``call``, which diff and load still read.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from gpudoctor.recording.store import load_recording
from gpudoctor.render.json_renderer import dumps
from gpudoctor.report.build import build_report
from tests.recording_builder import T0, RecordingBuilder

DATA = Path(__file__).parent / "data"
TRAINER_ARGS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": True, "tf32": True,
                "save_steps": 50, "save_only_model": False, "dataloader_num_workers": 0,
                "dataloader_pin_memory": True, "max_steps": 3000}


def sample_report(root: Path) -> dict[str, Any]:
    """A data-stalled single-H100 Trainer run: tokenizing in the loop, padding, frequent
    checkpoints, the built-in H100 price, and torch.profiler windows."""
    b = RecordingBuilder(root, cores=16, duration_s=300.0)
    rows = b.process(libs={"torch": "2.13.0", "transformers": "5.23.0"})
    end = b.training_loop(rows, start_s=20.0, steps=300, compute_s=0.5, wait_s=0.2, fetch_s=0.2,
                          save_every=50, save_s=4.0, trainer_args=TRAINER_ARGS, jitter_s=0.02)
    b.tokenizer_counters(rows, start_s=20.0, end_s=end, total_s=40.0)
    for i in range(300):
        lengths = [1500, 1790, 900, 1600, 1000, 1700, 1400, 1650]
        rows.append({"k": "batch", "t": T0 + 20.5 + i * 0.9, "tokens": 2048 * len(lengths),
                     "pad": 2048 * len(lengths) - sum(lengths), "seq_len": 2048, "lengths": lengths})
    rows.append({"k": "torch_cfg", "t": T0 + 10.0, "cuda": True, "device": "cuda",
                 "device_name": "NVIDIA H100 80GB HBM3", "device_capability": [9, 0], "matmul_precision": "high",
                 "allow_tf32": True, "param_dtype": "torch.float32", "autocast": True})
    for t0 in (60.0, 180.0):  # two profiler windows of 5 steps
        rows.append({"k": "profiler", "t": T0 + t0 + 4.6, "t0": T0 + t0, "dt": 4.6, "steps": 5,
                     "dataloader_s": 2.0, "cuda_kernel_s": 2.1})
    b.host_rows(cpu_total_pct=15.0, cpu_proc_pct=100.0)
    b.gpu_rows(util_pct=45.0, mem_used_mib=52000.0)
    return build_report(load_recording(b.write()))


def nogpu_report(root: Path) -> dict[str, Any]:
    """A crashed two-rank CPU run: no GPU, no price, rank 1 slower than rank 0."""
    b = RecordingBuilder(root, cores=8, duration_s=120.0)
    b.meta_extra.update(status="crashed", exit_code=1,
                        command=["torchrun", "--nproc_per_node", "2", "train_ddp.py", "--epochs", "1"])
    for pid, rank, compute in ((301, 0, 0.30), (302, 1, 0.38)):
        rows = b.process(pid=pid, rank=rank)
        b.training_loop(rows, start_s=25.0, steps=200, compute_s=compute, wait_s=0.05, fetch_s=0.05,
                        seed=rank)
    b.host_rows(cpu_total_pct=90.0, cpu_proc_pct=380.0)
    return build_report(load_recording(b.write()))


def main() -> int:
    for name, build in (("report_sample", sample_report), ("report_nogpu", nogpu_report)):
        with tempfile.TemporaryDirectory() as tmp:
            report = build(Path(tmp))
        (DATA / f"{name}.json").write_text(dumps(report))
        print(f"{name}: verdict {report['verdict']!r}; rules {[f['rule'] for f in report['findings']]}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
