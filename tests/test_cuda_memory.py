"""The CUDA allocator per step, and the predicted peak of a fix that changes the work per step.

No GPU here: the allocator's counters are faked at the hooks' boundary (``DeviceMemory``, as the
GPU's clock is at ``DeviceClock``), by :class:`tests.fake_cuda.FakeAllocator`, which the scenario
drives as a training's tensors would. The hooks and the writer of the ``cuda_mem`` lines are the
production ones; the reports are built from recordings as a CUDA run would leave them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudoctor import hooks
from gpudoctor.analysis import analyze
from gpudoctor.analysis.memory import SAFE_SHARE, step_memory
from gpudoctor.hooks.cuda_memory import AllocatorLines
from gpudoctor.recording.store import load_recording
from gpudoctor.render.html import HtmlRenderer
from gpudoctor.report.build import build_report
from tests.conftest import hooks_in
from tests.fake_cuda import FakeAllocator, FakeClock, FakeGpu
from tests.recording_builder import T0, RecordingBuilder

TOTAL_MIB = 81559.0
CONTEXT_MIB = 500.0  # what NVML counts for the process beyond the allocator's reserved


def _events(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in (folder / "events").glob("*.jsonl") for line in f.read_text().splitlines()]


def test_a_real_loop_writes_the_allocator_at_its_step_ends(tmp_path: Path) -> None:
    """A real CPU loop with the fake allocator in place of CUDA's: one ``cuda_mem`` line per step end
    for the first steps, each the allocator's figures at that end; without it (a CPU run) none."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def loop(allocator: FakeAllocator | None) -> tuple[list[dict[str, Any]], dict[int, float]]:
        folder = tmp_path / ("cuda" if allocator else "cpu")
        at_end: dict[int, float] = {}
        with hooks_in(folder):
            if allocator is not None:
                th = hooks.active_torch_hooks()
                assert th is not None
                th.start_gpu_clock("cpu", FakeClock(FakeGpu()), memory=allocator)
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            kept = []
            for n, (x, y) in enumerate(DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 1)),
                                                  batch_size=8), 1):
                if allocator is not None:
                    allocator.alloc(100.0)  # the forward's activations
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                if allocator is not None:
                    allocator.free(99.0)  # backward frees them, but for the loss kept below
                kept.append(loss)
                opt.step()
                at_end[n] = allocator.allocated_mib if allocator is not None else 0.0
        return _events(folder), at_end

    fake = FakeAllocator(total_mib=TOTAL_MIB)
    events, at_end = loop(fake)
    lines = [e for e in events if e["k"] == "cuda_mem"]
    assert [e["n"] for e in lines] == [1, 2, 3, 4, 5]  # 5 steps: each written (the first ones always are)
    assert [e["allocated_mib"] for e in lines] == pytest.approx([at_end[n] for n in range(1, 6)])
    assert [e["allocated_mib"] for e in lines] == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])  # the kept losses
    assert lines[-1]["peak_mib"] == pytest.approx(104.0) and lines[-1]["reserved_mib"] == pytest.approx(104.0)
    assert lines[0]["total_mib"] == pytest.approx(TOTAL_MIB) and all("total_mib" not in e for e in lines[1:])
    assert fake.reads == len(lines)  # read only when written
    plain, _ = loop(None)
    assert not [e for e in plain if e["k"] == "cuda_mem"]


def test_an_allocator_that_fails_never_reaches_the_training(tmp_path: Path) -> None:
    import torch

    class Broken(FakeAllocator):
        def read(self) -> tuple[float, float, float]:
            raise RuntimeError("CUDA error: the driver is gone")

    with hooks_in(tmp_path):
        th = hooks.active_torch_hooks()
        assert th is not None
        th.start_gpu_clock("cpu", FakeClock(FakeGpu()), memory=Broken())
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    events = _events(tmp_path)
    assert sum(1 for e in events if e["k"] == "step") == 3
    assert [e["where"] for e in events if e["k"] == "hook_error"] == ["CUDA allocator"]


Scenario = Callable[[FakeAllocator, int], None]


def _cuda_run(tmp_path: Path, step: Scenario, *, batch_size: int = 8, steps: int = 600) -> dict[str, Any]:
    """A 60 s CUDA loop (0.1 s steps from 5 s): ``step`` drives the allocator through each step, the
    production writer takes its ``cuda_mem`` lines at the step ends, NVML sees reserved + the context."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=70.0)
    rows = b.process()
    b.training_loop(rows, start_s=5.0, steps=steps, compute_s=0.1, wait_s=0.0, fetch_s=0.0, batch_size=batch_size)
    rows.append({"k": "torch_cfg", "t": T0 + 5.0, "cuda": True, "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
                 "device_capability": [9, 0], "param_dtype": "torch.bfloat16", "autocast": False, "libs": {}})
    fake = FakeAllocator(total_mib=TOTAL_MIB)
    now = [T0]
    lines = AllocatorLines(fake, rows.append, now=lambda: now[0])
    used: list[tuple[float, float]] = []  # (t, what NVML sees on the device)
    for n in range(1, steps + 1):
        now[0] = T0 + 5.0 + 0.1 * n
        step(fake, n)
        lines.step_end(n)
        used.append((now[0], fake.reserved_mib + CONTEXT_MIB))
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    b.gpus_meta = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": TOTAL_MIB}]
    b.gpu = [{"t": t, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_pct": 60.0, "mem_used_mib": v,
                                "mem_total_mib": TOTAL_MIB, "proc_mem_mib": v, "lost": False}]}
             for t, v in used[9::10]]  # once a second, the last at the last step
    b.write()
    return build_report(load_recording(tmp_path))


def _training(static_mib: float, act_mib: float, *, keep_mib: float = 0.0, fragment_mib: float = 0.0,
              empty_cache: bool = False) -> Scenario:
    """Each step: the weights, gradients and optimizer state (``static_mib``) from the first, the
    activations allocated and freed; ``keep_mib`` kept across steps (a list of losses with their
    graphs), ``fragment_mib`` cached in blocks never reused; ``empty_cache`` after every step."""

    def step(m: FakeAllocator, n: int) -> None:
        if n == 1:
            m.alloc(static_mib)
        m.alloc(act_mib)
        m.free(act_mib - keep_mib)
        m.fragment(fragment_mib)
        if empty_cache:
            m.empty_cache()

    return step


def _growth(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule"] == "memory_growth"), None)


def test_tensors_kept_across_steps_are_named_from_the_allocated_growth(tmp_path: Path) -> None:
    report = _cuda_run(tmp_path, _training(6000.0, 2000.0, keep_mib=2.0))  # 2 MiB a 0.1 s step
    f = _growth(report)
    assert f is not None
    d = f["data"]
    assert d["where"] == "gpu" and d["kind"] == "tensors"
    truth = 2.0 / 0.1 * 3600  # the loop's own growth: 72,000 MiB an hour
    assert d["cuda_allocator"]["allocated_growth_mib_per_hour"] == pytest.approx(truth, rel=0.01)
    assert d["growth_mib_per_hour"] == pytest.approx(truth, rel=0.05)  # NVML's, beside it
    assert d["cuda_allocator"]["nvml_proc_mib"] == pytest.approx(d["cuda_allocator"]["reserved_mib"] + CONTEXT_MIB)
    assert "tensors kept across steps" in f["evidence"] and "NVML's per-process figure" in f["evidence"]
    assert ".detach()" in f["fix"]["summary"]


def test_cached_blocks_growing_over_flat_allocated_memory_are_named_fragmentation(tmp_path: Path) -> None:
    report = _cuda_run(tmp_path, _training(6000.0, 2000.0, fragment_mib=2.0))
    f = _growth(report)
    assert f is not None
    d = f["data"]
    assert d["kind"] == "cache" and d["cuda_allocator"]["allocated_growth_mib_per_hour"] is None
    assert d["cuda_allocator"]["reserved_growth_mib_per_hour"] == pytest.approx(72_000, rel=0.01)
    assert "fragmentation" in f["evidence"] and "expandable_segments" in f["fix"]["summary"]


def test_a_healthy_cuda_loop_has_no_memory_finding(tmp_path: Path) -> None:
    assert _growth(_cuda_run(tmp_path, _training(6000.0, 2000.0))) is None


def _batch_finding(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["rule"] == "small_batch")


def test_a_batch_that_fits_says_its_predicted_peak_and_headroom(tmp_path: Path) -> None:
    """10 GiB held across steps, 1 GB of activations per sample of a batch of 2: × 16 peaks at 42 GB."""
    report = _cuda_run(tmp_path, _training(10_000.0, 2000.0), batch_size=2)
    f = _batch_finding(report)
    mem = f["fix"]["memory"]
    limit = SAFE_SHARE * TOTAL_MIB - CONTEXT_MIB
    assert f["fix"]["config"]["batch_size"] == 32
    assert mem["predicted_peak_mib"] == pytest.approx(10_000 + 16 * 2000, abs=1)
    assert mem["limit_mib"] == pytest.approx(limit, abs=1)
    assert mem["headroom_mib"] == pytest.approx(limit - 42_000, abs=1) and mem["headroom_mib"] > 0
    assert limit < 10_000 + 32 * 2000  # the next power of two would not fit
    assert "1,000.00 MiB per sample" in mem["basis"]


def test_a_batch_prescription_is_capped_by_the_measured_peak(tmp_path: Path) -> None:
    """The cache is emptied every step, so NVML sees 6.5 GB and suggests × 8; the activations
    (20 GB for 2 samples) allow × 2 only."""
    report = _cuda_run(tmp_path, _training(6000.0, 20_000.0, empty_cache=True), batch_size=2)
    f = _batch_finding(report)
    assert f["fix"]["config"]["batch_size"] == 4
    assert "suggests 8x" in f["evidence"] and "allows 2x" in f["evidence"]
    mem = f["fix"]["memory"]
    assert mem["predicted_peak_mib"] == pytest.approx(46_000, abs=1) and mem["headroom_mib"] > 0
    m = step_memory(analyze(load_recording(tmp_path)))
    assert m is not None and m.headroom_mib(4) < 0 and m.headroom_mib(8) < 0


def test_a_batch_that_would_not_fit_is_not_prescribed(tmp_path: Path) -> None:
    report = _cuda_run(tmp_path, _training(6000.0, 40_000.0, empty_cache=True), batch_size=2)
    f = _batch_finding(report)
    assert f["severity"] == "info" and f["waste_fraction"] == 0 and not f["fix"].get("config")
    assert f["fix"]["memory"]["headroom_mib"] < 0
    assert "would not fit" in f["title"]


def test_a_cpu_run_says_the_peak_is_unavailable(tmp_path: Path) -> None:
    """Padding on a CPU run: the fix is prescribed, its peak said unavailable, not invented."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=30.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.2, wait_s=0.0, fetch_s=0.0)
    rows += [{"k": "batch", "t": T0 + 2.0 + 0.2 * i, "tokens": 8 * 512, "pad": 8 * 512 - 8 * 100, "seq_len": 512,
              "lengths": [60, 80, 90, 100, 110, 120, 120, 120]} for i in range(1, 100)]
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    b.write()
    report = build_report(load_recording(tmp_path))
    f = next(f for f in report["findings"] if f["rule"] == "padding_waste")
    mem = f["fix"]["memory"]
    assert mem["predicted_peak_mib"] is None and mem["headroom_mib"] is None
    assert "unavailable on a CPU run" in mem["basis"]
    from gpudoctor.render.markdown import finding_detail
    assert "Predicted peak memory with this fix: unavailable" in finding_detail(1, f)


def test_the_allocators_series_are_drawn_beside_nvmls(tmp_path: Path) -> None:
    report = _cuda_run(tmp_path, _training(6000.0, 2000.0, keep_mib=2.0))
    series = report["timeline"]["series"]
    allocated, reserved = series["alloc_allocated_mib"], series["alloc_reserved_mib"]
    assert len(series["alloc_t_s"]) == len(allocated) == len(reserved) > 100
    assert allocated[-1] - allocated[0] == pytest.approx(2.0 * (len(allocated) - 1) * 600 / len(allocated), rel=0.1)
    assert all(r >= a for a, r in zip(allocated, reserved, strict=True))
    html = HtmlRenderer().render(report)
    assert "CUDA allocator: allocated (dotted)" in html and "CUDA allocator: reserved (dash-dot)" in html
    assert "their GPU memory (dashed)" in html and 'stroke-dasharray="2 2"' in html
