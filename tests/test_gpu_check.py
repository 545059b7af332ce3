"""bench/gpu_check.py: its dry path (what CI has), and each check's judgement on CPU.

The GPU checks themselves need a GPU; what can run here is the plumbing: the command's dry path
end to end, and every ``judge_*`` fed what the check would feed it, from the fake device clock
(reports built from ``tests/fake_cuda.py`` replays, with the fake's own ground truth as the
probe's truth) and the fake NVML binding (through the real ``GpuSampler``). Each judgement is
shown to pass on agreeing figures and to fail when the truth is moved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from gpudoctor.samplers.nvml import Nvml
from tests.fake_cuda import PATTERNS, replay
from tests.fake_nvml import FakeBinding, FakeGpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "probes"))

import gpu_check  # noqa: E402
from gpu_mfu import hand_flops_per_token  # noqa: E402


def test_the_dry_path_skips_every_row_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    names = [n for _, _, ns in gpu_check.CHECKS for n in ns]
    assert [r["check"] for r in rows] == names and len(names) == 16
    assert all(r["result"] == "skipped" and r["note"] == "no GPU: skipped" for r in rows)
    assert "| nvml utilization | — | — | skipped | no GPU: skipped |" in done.stdout


def _fake_truth(name: str, played: Any) -> dict[str, Any]:
    """What ``probes/gpu_patterns.py`` would write, from the fake GPU's own construction."""
    p = PATTERNS[name]
    saves = played.steps // p.save_every if p.save_every else 0
    per_save = p.save_copy_s + p.save_write_s
    step_s = (played.loop_s - saves * per_save) / played.steps
    idle_in_waits = 0.0 if p.sync_python_s or p.save_every else 1 - played.true_busy  # else all idle is in waits
    return {"gpu_step_ms_p50": 1000 * step_s, "gpu_busy_share_of_gpu_time": played.true_busy,
            "gpu_idle_in_wait_share_of_gpu_time": idle_in_waits,
            "gpu_idle_after_sync_ms_p50": 1000 * p.sync_python_s if p.sync_python_s else None,
            "gpu_save_ms_p50": 1000 * per_save if saves else None}


@pytest.fixture(scope="module")
def fake_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    root = tmp_path_factory.mktemp("patterns")
    out = {}
    for name in ("trap", "sync", "stall", "save"):
        played = replay(name, root / name)
        out[name] = (build_report(load_recording(played.root)), _fake_truth(name, played))
    return out


@pytest.mark.parametrize("pattern", ["trap", "sync", "stall", "save"])
def test_each_pattern_is_judged_against_its_truth(pattern: str, fake_reports: dict[str, Any]) -> None:
    report, truth = fake_reports[pattern]
    row = gpu_check.judge_pattern(pattern, report, truth)
    assert row.result == "pass", (row.measured, row.truth, row.note)
    moved = {**truth, "gpu_step_ms_p50": truth["gpu_step_ms_p50"] * 1.5}
    off = gpu_check.judge_pattern(pattern, report, moved)
    assert off.result == "fail" and "step" in off.note


def test_a_stall_is_expected_exactly_where_the_truth_saw_the_gpu_idle(fake_reports: dict[str, Any]) -> None:
    """The trap on the H200 was a real 15% stall (a 173 ms build behind a 180 ms step): the judgement
    follows the truth's idle share, not the pattern's name; a promise beyond that idle fails."""
    trap, trap_truth = fake_reports["trap"]
    stall, stall_truth = fake_reports["stall"]
    assert gpu_check.judge_pattern("trap", trap, {**trap_truth, "gpu_idle_in_wait_share_of_gpu_time": 0.3}
                                   ).result == "fail"  # the truth says stall; the report says none
    assert gpu_check.judge_pattern("stall", stall, {**stall_truth, "gpu_idle_in_wait_share_of_gpu_time": 0.01}
                                   ).result == "fail"
    capped = gpu_check.judge_pattern("stall", stall, {**stall_truth, "gpu_idle_in_wait_share_of_gpu_time": 0.2})
    assert capped.result == "fail" and "prediction within the idle" in capped.note


def test_a_missing_report_is_an_error_not_a_pass() -> None:
    row = gpu_check.judge_pattern("trap", None, {"gpu_step_ms_p50": 100.0}, rc=1)
    assert row.result == "error" and "exit code 1" in row.note


def test_mfu_is_judged_against_the_hand_count(fake_reports: dict[str, Any]) -> None:
    report, truth = fake_reports["trap"]  # the fake's model: GPT-2 124M in bf16, 8 rows of 512
    inputs = report["mfu"]["inputs"]
    tokens = inputs["tokens_per_step"]
    hand = {"hand_flops_per_step": tokens * hand_flops_per_token(12, 768, 50257, 512),
            "gpu_step_ms_p50": truth["gpu_step_ms_p50"]}
    row = gpu_check.judge_mfu("bf16", report, hand)
    assert row.result == "pass", (row.measured, row.truth, row.note)
    assert gpu_check.judge_mfu("fp32", report, hand).result == "fail"  # the recorded precision is bf16
    doubled = {**hand, "hand_flops_per_step": 2 * hand["hand_flops_per_step"]}
    assert "flops" in gpu_check.judge_mfu("bf16", report, doubled).note


def _smi_of(binding: FakeBinding) -> Any:
    """nvidia-smi's units (%, MiB, W) of the fake device's numbers."""
    gpu = binding.gpus[0]
    return lambda pid: {"util_pct": float(gpu.util_pct), "mem_used_mib": gpu.mem_used_b / 2**20,
                        "power_w": gpu.power_mw / 1000, "proc_mem_mib": next(
                            (b / 2**20 for p, b in gpu.procs if p == pid and b is not None), None)}


def test_nvml_through_the_sampler_agrees_with_the_same_counters() -> None:
    gpu = FakeGpu("NVIDIA H100 80GB HBM3", "GPU-1", 80 * 2**30, 30 * 2**30, 87, 412_000, 1980,
                  procs=[(4242, 2 * 2**30), (99, 2**30)])
    binding = FakeBinding([gpu])
    nvml = Nvml(binding=binding)
    assert nvml.init()
    rows = gpu_check.judge_nvml(gpu_check.sample_pairs(nvml, 4242, _smi_of(binding), n=3, pause_s=0))
    assert [r.result for r in rows] == ["pass"] * 4, [(r.check, r.measured, r.truth) for r in rows]
    nvml = Nvml(binding=binding)
    assert nvml.init()
    skewed = _smi_of(binding)
    pairs = gpu_check.sample_pairs(nvml, 4242, lambda pid: {**skewed(pid), "mem_used_mib": 20 * 1024.0},
                                   n=2, pause_s=0)
    assert [r.result for r in gpu_check.judge_nvml(pairs)] == ["pass", "fail", "pass", "pass"]


def test_a_process_nvidia_smi_cannot_see_is_skipped_not_failed() -> None:
    rows = gpu_check.judge_nvml([({"proc_mem_mib": None, "util_pct": 50.0},
                                  {"proc_mem_mib": None, "util_pct": 52.0})])
    by = {r.check: r for r in rows}
    assert by["nvml per-process memory"].result == "skipped"
    assert by["nvml utilization"].result == "pass"


def test_the_clock_cost_row_reads_the_bench_script(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "bench/gpu_clock_cost.py", "--steps", "2000", "--repeats", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    row = gpu_check.judge_clock_cost(done.stdout, done.returncode)
    assert row.result in ("pass", "fail") and row.figures["ratio"] > 0 and "us median" in row.measured
    assert gpu_check.judge_clock_cost("", 2).result == "error"


def test_prescription_attach_and_graph_rows() -> None:
    kept = {"top": "padding_waste", "predicted": 2.0, "achieved": 1.9, "within": True,
            "fix_words": ["--max-length", "256"], "spread": [1.8, 2.0]}
    assert gpu_check.judge_prescription("padding", "padding_waste", kept).result == "pass"
    assert gpu_check.judge_prescription("padding", "padding_waste", {**kept, "within": False}).result == "fail"
    assert gpu_check.judge_prescription("padding", "padding_waste", {**kept, "top": "data_stall"}).result == "fail"
    ends = [i / 10 for i in range(0, 300)]  # 10 steps/s for 30 s
    attached = [t for t in ends if not 10 <= t < 20] + [10 + i / 9.8 for i in range(98)]
    assert gpu_check.judge_attach(sorted(attached), 10.0, 20.0, 8.0, 0, None).result == "pass"
    slow = [t for t in ends if not 10 <= t < 20] + [10 + i / 8 for i in range(80)]
    assert gpu_check.judge_attach(sorted(slow), 10.0, 20.0, 8.0, 0, None).result == "fail"
    warming = [t for t in attached if t >= 4] + [2 + i / 3 for i in range(6)]  # a slow start before the attach
    assert gpu_check.judge_attach(sorted(warming), 10.0, 20.0, 8.0, 0, None).result == "error"
    bare = {"weights_sha256": "ab" * 32, "weights_sum": 1.0}
    assert gpu_check.judge_graph(bare, dict(bare), 0, 0, None).result == "pass"
    assert gpu_check.judge_graph(bare, None, 1, 0, None).result == "fail"
    assert gpu_check.judge_graph(bare, {**bare, "weights_sha256": "cd" * 32, "weights_sum": 1.5}, 0, 0,
                                 None).result == "fail"
