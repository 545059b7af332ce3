"""A day-long attach or run keeps the doctor's memory flat: samples go to disk, nothing is kept
per sample or per event (measured with tracemalloc over many real ticks)."""

from __future__ import annotations

import gc
import inspect
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from gpudoctor.hooks.writer import EventWriter
from gpudoctor.recording.store import JsonlAppender
from gpudoctor.samplers.host import HostSampler
from gpudoctor.samplers.nvml import GpuSampler, Nvml
from tests.fake_nvml import FakeBinding, FakeGpu

GIB = 1024**3


def growth_bytes(step: Callable[[], None], warmup: int, n: int,
                 rebuilt: Callable[..., object] | None = None) -> int:
    """Python heap growth in gpudoctor's code over ``n`` calls of ``step``, after ``warmup`` calls
    (the fake NVML binding keeps a log of every call: not ours). Allocations made on the lines of
    ``rebuilt``, a function whose state is replaced whole at each call, are left out: that state is
    the size of what it last saw, which the caller bounds apart."""
    for _ in range(warmup):
        step()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(n):
            step()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    skip: tuple[str, range] | None = None
    if rebuilt is not None:
        lines, first = inspect.getsourcelines(rebuilt)
        skip = (inspect.getsourcefile(rebuilt) or "", range(first, first + len(lines)))
    stats = after.compare_to(before, "lineno")
    return sum(s.size_diff for s in stats
               if not s.traceback[0].filename.endswith(("tracemalloc.py", "fake_nvml.py"))
               and not (skip and s.traceback[0].filename == skip[0] and s.traceback[0].lineno in skip[1]))


def test_host_sampler_keeps_nothing_per_sample(tmp_path):
    """Every few seconds the sampler reads each process of the machine (the other programs' CPU) and
    keeps that table until the next read, replaced whole: its size is the machine's process count, not
    the samples' (it went over this test's 32 KB beside two busy programs and a busy pytest worker). It
    is bounded by the processes alive; the rest must not grow."""
    sampler = HostSampler(os.getpid(), JsonlAppender(tmp_path / "host.jsonl"), interval_s=0.1, tree_refresh_s=0.0)
    grown = growth_bytes(sampler.tick, warmup=30, n=300, rebuilt=HostSampler._other_programs)
    sampler.stop()
    assert sampler.rows_written == 330
    assert grown < 32 * 1024, f"{grown} bytes kept over 300 samples"


def test_the_other_programs_table_keeps_none_of_the_dead(tmp_path):
    """Each read replaces the table whole: a program seen once and gone since leaves no entry. (Its
    size against ``psutil.pids()`` read later raced the machine: 73 entries for 72 processes on a
    busy CI, a process ended between the two reads.)"""
    patient = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # outside the patient's tree
    sampler = HostSampler(patient.pid, JsonlAppender(tmp_path / "host.jsonl"), interval_s=0.1)
    try:
        sampler._other_programs(1.0)
        assert any(pid == other.pid for pid, _ in sampler._others_cpu)
        other.kill()
        other.wait()
        sampler._other_programs(2.0)
        assert not any(pid == other.pid for pid, _ in sampler._others_cpu)
    finally:
        sampler.stop()
        for proc in (patient, other):
            proc.kill()
            proc.wait()


def test_gpu_sampler_keeps_nothing_per_sample_even_when_a_gpu_is_lost(tmp_path):
    gpus = [FakeGpu(f"Fake H100 {i}", f"GPU-{i}", 80 * GIB, 10 * GIB, 50, 300_000, 1980, procs=[(os.getpid(), GIB)])
            for i in range(8)]
    gpus[3].unsupported = {"nvmlDeviceGetPowerUsage"}
    nvml = Nvml(binding=FakeBinding(gpus))
    assert nvml.init()
    sampler = GpuSampler(nvml, JsonlAppender(tmp_path / "gpu.jsonl"), pids_provider=lambda: {os.getpid()})
    sampler.tick()
    gpus[5].lost = True  # falls off the bus: reported once, not once per tick
    grown = growth_bytes(sampler.tick, warmup=20, n=400)
    sampler.stop()
    assert grown < 32 * 1024, f"{grown} bytes kept over 400 samples"
    assert len(nvml.problems()) == 2  # power unsupported on GPU 3, GPU 5 lost


def test_event_writer_buffers_only_between_flushes(tmp_path: Path):
    writer = EventWriter(tmp_path)
    event = {"k": "step", "t": 1.0, "n": 1, "dt": 0.001}

    def one_flush_period() -> None:
        for _ in range(200):  # a fast loop: 200 events and a tokenizer counter per flush
            writer.emit(dict(event))
            writer.count("tokenize", 0.001)
        writer.flush()

    grown = growth_bytes(one_flush_period, warmup=5, n=100)
    writer.close()
    assert grown < 32 * 1024, f"{grown} bytes kept over 20,000 events"
    lines = (tmp_path / "events" / f"{os.getpid()}.jsonl").read_text().splitlines()
    assert sum('"k":"step"' in x for x in lines) == 105 * 200


def test_a_long_recording_loads_downsampled_samples_and_every_step(tmp_path):
    """bench/long_report.py's generator, 18 minutes: samples are read evenly spread
    (at most 2,000 rows, first and last included); every step and wait still counts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("long_report", Path(__file__).parents[1] / "bench/long_report.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.generate(tmp_path, hours=0.3, hz=10, n_gpus=8, cores=16)
    assert (tmp_path / "samples" / "gpu.jsonl").stat().st_size > 16 * 2**20  # past the full-read size

    from gpudoctor.recording.store import load_recording
    from gpudoctor.report.build import build_report

    rec = load_recording(tmp_path)
    assert 1900 <= len(rec.gpu) <= 2000 and len(rec.host) == 10800
    assert rec.gpu[0]["t"] == bench.T0 and rec.gpu[-1]["t"] == bench.T0 + 10799 / 10
    report = build_report(rec)
    steps = report["steps"]["count"]
    assert abs(steps - (1080 - 60) / bench.STEP_S) < 0.1 * steps
    assert report["notes"] == []  # downsampling is not a defect of the recording
