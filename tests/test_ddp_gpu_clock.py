"""DDP's exposed all-reduce on the GPU's own clock (issue #29, the GPU part).

Under NCCL the host returns from backward at once: the training stream, not the host, waits for
the all-reduce after backward's last bucket. A fake CUDA stream (tests/fake_cuda.py) plays a DDP
loop with an all-reduce on its own (network) stream; the production :class:`GpuMarks` records a
mark at each bucket's launch and one when backward is over, and the doctor's exposed seconds are
held to the fake's ground truth. Virtual seconds (epoch-sized, so exact to ~1 µs), never this machine's load.

The ordering the marks rely on on a real GPU (our end-of-backward callback runs after DDP's
finalize, which is what makes the stream wait) is checked on a real CPU DDP model (gloo, one rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis import analyze
from gpudoctor.analysis.comm import comm_figures
from gpudoctor.hooks.device_clock import GpuMarks
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.fake_cuda import FakeClock, FakeEvent, FakeGpu, FakeProcess
from tests.recording_builder import T0

BUCKETS = 4
FORWARD_S, BACKWARD_S, OPTIMIZER_S = 0.030, 0.060, 0.010


class StrictClock(FakeClock):
    """A fake ``torch.cuda.Event`` that refuses to be read before the GPU passed it: reading one
    early would block the host on a real GPU (``elapsed_time`` on an unfinished event)."""

    early_reads = 0

    def elapsed_ms(self, a: FakeEvent, b: FakeEvent) -> float:
        if max(a.reached, b.reached) > self.gpu.now:
            self.early_reads += 1
        return super().elapsed_ms(a, b)


@dataclass
class Played:
    root: Path
    gpu: FakeGpu
    clock: StrictClock
    exposed_s: list[float]  # ground truth per step: the training stream's wait after backward
    loop: tuple[float, float]
    syncs: int


def play_ddp(root: Path, allreduce_s: float, steps: int = 40) -> Played:
    """``for batch in loader: loss = ddp(batch); loss.backward(); opt.step()`` on a CUDA stream;
    each of ``BUCKETS`` buckets all-reduces for ``allreduce_s`` on the network stream once its
    gradients are computed, one after the other; DDP's finalize makes the training stream wait for
    the last one."""
    proc = FakeProcess.open(root, queue_s=0.2, clock=StrictClock)  # the host at most ~1.5 steps ahead
    gpu, b, rows, marks, start = proc.gpu, proc.builder, proc.rows, proc.marks, proc.start
    assert isinstance(proc.clock, StrictClock)
    clock = proc.clock
    rows += [
        {"k": "loader", "t": start, "id": 1, "num_workers": 4, "batch_size": 8, "pin_memory": True,
         "prefetch_factor": 2, "persistent_workers": False, "params": ["dataset", "batch_size", "num_workers"]},
        {"k": "first_step", "t": start},
        {"k": "gpu_clock", "t": start, "device": "cuda:0", "source": "cuda_events"},
        {"k": "ddp", "t": start, "find_unused_parameters": False, "static_graph": False,
         "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0, "world_size": 2, "backend": "nccl",
         "params": 100, "param_bytes": 400_000_000, "device": "cuda"},
    ]
    truth: list[float] = []
    syncs = 0
    for n in range(1, steps + 1):
        t0 = gpu.now
        marks.wait_start(t0)
        gpu.host(0.0005)  # workers have the batch ready
        rows.append({"k": "span", "c": "data_wait", "t0": t0, "dt": gpu.now - t0, "name": "DataLoader.__next__"})
        marks.wait_end()
        gpu.launch(FORWARD_S)
        net_free = 0.0
        for _ in range(BUCKETS):
            gpu.launch(BACKWARD_S / BUCKETS)
            marks.comm_launch()  # DDP's comm hook: the bucket's gradients are queued before it
            net_free = max(net_free, gpu.busy_until) + allreduce_s  # NCCL starts once they are computed
        backward_end = gpu.busy_until
        gpu.busy_until = max(gpu.busy_until, net_free)  # finalize: the stream waits (idle) for the all-reduce
        truth.append(gpu.busy_until - backward_end)
        marks.comm_end()
        gpu.launch(OPTIMIZER_S)
        rows.append({"k": "step", "t": gpu.now, "n": n, "dt": 0.001})
        rows.append({"k": "comm", "t": gpu.now, "n": n, "micro": 1, "synced": 1, "buckets": BUCKETS,
                     "bytes": 400_000_000, "comm_s": round(BUCKETS * allreduce_s, 6), "exposed_s": None,
                     "search_s": 0.0, "direct": 0, "direct_bytes": 0, "direct_s": 0.0})
        marks.step_end(n)
    gpu.sync()  # the process exits: its queue drains
    syncs += 1
    marks.poll()
    loop = (start, gpu.now)
    b.duration_s = gpu.now - T0 + 0.5
    b.write()
    return Played(root, gpu, clock, truth, loop, syncs)


def _findings(root: Path) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in build_report(load_recording(root))["findings"]}


def _gpu_steps(root: Path) -> list[dict[str, Any]]:
    p = analyze(load_recording(root)).primary
    assert p is not None and p.gpu_clock is not None
    return list(p.gpu_clock.steps)


def test_exposed_all_reduce_is_measured_on_the_gpu_clock_and_fires(tmp_path: Path) -> None:
    played = play_ddp(tmp_path / "exposed", allreduce_s=0.020)
    assert played.exposed_s[-1] == pytest.approx(0.035, abs=1e-5)  # the scenario: 4 × 20 ms behind a 15 ms bucket
    steps = _gpu_steps(played.root)
    assert len(steps) == 40 and all(s["comms"] == 1 for s in steps)
    assert [s["comm_wait_s"] for s in steps] == pytest.approx(played.exposed_s, abs=1e-5)
    a = analyze(load_recording(played.root))
    p = a.primary
    assert p is not None
    fig = comm_figures(p)
    assert fig is not None and fig.exposed_clock == "gpu" and fig.exposed_s == pytest.approx(0.035, abs=1e-5)
    # the breakdown's communication is the stream's wait; its spans sit on the host's timeline at the
    # last bucket's launch, so while the host fills the launch queue (the first two steps here) two
    # overlap and count once: within 5% of the truth over 40 steps, never above it
    assert sum(played.exposed_s) * 0.95 <= p.seconds("communication") <= sum(played.exposed_s) + 1e-5
    report = build_report(load_recording(played.root))
    lo, hi = played.loop
    true_busy = played.gpu.busy_s(lo, hi) / (hi - lo)
    assert report["gpu_timeline"]["busy_fraction"] == pytest.approx(true_busy, abs=0.02)
    f = {x["rule"]: x for x in report["findings"]}["exposed_communication"]
    assert f["severity"] != "info" and f["claims"]
    assert f["data"]["exposed_per_step_s"] == pytest.approx(0.035, abs=1e-4)
    step = f["data"]["step_s"]
    assert f["data"]["predicted_loop_speedup"] == pytest.approx(step / (step - 0.0175), abs=1e-3)
    assert f["data"]["predicted_loop_speedup_up_to"] == pytest.approx(step / (step - 0.035), abs=1e-3)
    assert "GPU's clock" in f["evidence"] and "bucket_cap_mb" in f["fix"]["summary"] + str(f["fix"].get("snippet"))
    # never a sync: every event read back after the GPU passed it, and the only sync is the exit's
    assert played.clock.early_reads == 0 and played.syncs == 1
    assert played.clock.records == 40 * (2 + BUCKETS + 1)  # per step: a wait's two, one per bucket, backward's end


def test_all_reduce_hidden_behind_backward_does_not_fire(tmp_path: Path) -> None:
    played = play_ddp(tmp_path / "hidden", allreduce_s=0.002)
    assert played.exposed_s[-1] == pytest.approx(0.002, abs=1e-5)  # only the last bucket's own all-reduce shows
    steps = _gpu_steps(played.root)
    assert [s["comm_wait_s"] for s in steps] == pytest.approx(played.exposed_s, abs=1e-5)
    assert "exposed_communication" not in _findings(played.root)
    assert played.clock.early_reads == 0


def test_a_cpu_run_writes_no_gpu_comm_fields(tmp_path: Path) -> None:
    """No comm mark, no field: the GPU step lines of a run without DDP stay as they were."""
    gpu = FakeGpu(now=T0, busy_until=T0)
    rows: list[dict[str, Any]] = []
    marks = GpuMarks(FakeClock(gpu), rows.append, now=lambda: gpu.now)
    marks.comm_end()  # an end without a launch (a backward with no CUDA bucket) records nothing
    for n in (1, 2):
        gpu.launch(0.01)
        marks.step_end(n)
    gpu.sync()
    marks.poll()
    assert [r["k"] for r in rows] == ["gpu_step", "gpu_step"]
    assert not any("comm_wait_s" in r for r in rows)


def test_the_end_of_backward_mark_follows_ddps_finalize(tmp_path: Path) -> None:
    """A real DDP model (CPU, gloo, one rank): the end-of-backward mark is recorded once per
    backward, after DDP's finalize copied the all-reduced buckets into the gradients (what, on a
    GPU, queues the stream's wait for NCCL before our event)."""
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    from gpudoctor.hooks.comm_hooks import CommHooks

    class Probe:
        """GpuMarks' two comm calls, noting the gradients DDP had written when the end came."""

        def __init__(self) -> None:
            self.launches = 0
            self.ends: list[float] = []

        def comm_launch(self) -> None:
            self.launches += 1

        def comm_end(self) -> None:
            self.ends.append(float(model.module.weight.grad.sum()))

    probe = Probe()
    hooks = CommHooks(writer=None)  # type: ignore[arg-type]  # only the GPU path is exercised
    hooks.gpu_marks = lambda: probe

    def doubled(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not strings
        hooks._gpu_bucket()  # what a CUDA bucket does in the timed hook
        fut: Any = torch.futures.Future()
        fut.set_result(bucket.buffer() * 2)  # DDP's finalize writes this back into .grad
        return fut

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1, bias=False))
        model.register_comm_hook(None, doubled)
        x = torch.ones(4, 8)
        expected = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
            expected.append(float(model.module.weight.grad.sum()))
            assert expected[-1] == pytest.approx(2 * 4 * 8)  # doubled: finalize ran
    finally:
        dist.destroy_process_group()
    assert probe.launches == 3 and probe.ends == expected  # after finalize, once per backward
    assert not hooks.gpu_end_queued
