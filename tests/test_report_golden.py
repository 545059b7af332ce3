"""The same recording gives the same ``report.json``: refactors of types and layers change no figure.

Two recordings from :mod:`tests.recording_builder` (a GPU run with most rules firing; a CPU run with
a data stall, tokenizing in the loop and checkpoints) are analysed, rendered to ``report.json`` and
compared with goldens in ``tests/data/golden/``, volatile fields masked (when the report was made,
the gpudoctor version, the run folder). To accept an intended change, rerun with
``GPUDOCTOR_UPDATE_GOLDEN=1`` and read the diff of the golden files before committing them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording import load_recording
from gpudoctor.render.json_renderer import JsonRenderer
from gpudoctor.report.build import ReportOptions, build_report
from tests.recording_builder import T0, RecordingBuilder

GOLDEN = Path(__file__).parent / "data" / "golden"
VOLATILE = {"generated_at", "gpudoctor_version", "version", "run_dir", "folder", "path"}


def _gpu_run(root: Path) -> RecordingBuilder:
    """An H100 at 40% busy in FP32 without TF32, small batches, a checkpoint every 100 steps."""
    b = RecordingBuilder(root, cores=16, duration_s=100.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=600, compute_s=0.12, wait_s=0.02, fetch_s=0.015,
                    save_every=100, save_s=1.5, jitter_s=0.01, seed=3,
                    trainer_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                                  "tf32": None, "bf16": False, "torch_compile": False, "save_steps": 100,
                                  "dataloader_num_workers": 0, "max_steps": 600})
    rows.append({"k": "torch_cfg", "t": T0 + 2.0, "cuda": True, "device": "cuda",
                 "device_name": "NVIDIA H100 80GB HBM3", "device_capability": [9, 0],
                 "matmul_precision": "highest", "allow_tf32": False, "cudnn_allow_tf32": True,
                 "param_dtype": "torch.float32", "autocast": False})
    b.host_rows(cpu_total_pct=10.0, cpu_proc_pct=100.0)
    b.gpu_rows(util_pct=40.0, mem_used_mib=9000.0)
    return b


def _cpu_run(root: Path, cuda: bool | None = None) -> RecordingBuilder:
    """No GPU; the loop waits on an in-process loader that tokenizes, and pads its batches. With
    ``cuda``, a ``torch_cfg`` line saying where the training computes (the golden has none)."""
    b = RecordingBuilder(root, cores=8, duration_s=60.0)
    rows = b.process(libs={"torch": "2.13.0", "transformers": "5.23.0", "tokenizers": "0.22.0"})
    end = b.training_loop(rows, start_s=5.0, steps=400, compute_s=0.05, wait_s=0.08, fetch_s=0.075,
                          jitter_s=0.005, seed=7)
    b.tokenizer_counters(rows, start_s=5.0, end_s=end, total_s=25.0)
    if cuda is not None:
        rows.append({"k": "torch_cfg", "t": T0 + 5.0, "cuda": cuda, "device": "cuda:0" if cuda else "cpu"})
    for i in range(50):
        rows.append({"k": "batch", "t": T0 + 6.0 + i, "tokens": 4096, "pad": 2048, "seq_len": 512,
                     "lengths": [256] * 8})
    b.host_rows(cpu_total_pct=14.0, cpu_proc_pct=100.0)
    return b


SCENARIOS = {"gpu_fp32_h100": _gpu_run, "cpu_tokenizing": _cpu_run}


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<masked>" if k in VOLATILE else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def report_json(root: Path, scenario: str) -> dict[str, Any]:
    report = build_report(load_recording(SCENARIOS[scenario](root).write()), ReportOptions())
    return _masked(json.loads(JsonRenderer().render(report)))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_same_recording_gives_the_same_report_json(tmp_path, scenario):
    got = report_json(tmp_path / "run", scenario)
    path = GOLDEN / f"{scenario}.report.json"
    if os.environ.get("GPUDOCTOR_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert got["findings"], "a golden without findings would hold the rules to nothing"
    assert got == json.loads(path.read_text())
