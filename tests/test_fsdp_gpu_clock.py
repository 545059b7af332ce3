"""FSDP2's collectives on the GPU's own clock (issue #29, the GPU part).

Under NCCL, FSDP's all-gathers and reduce-scatters run on their own streams and the host returns at
once; the training stream waits for them (``wait_for_unshard``, and at the end of backward for the
last reduce-scatters). A fake CUDA stream (tests/fake_cuda.py) plays an FSDP loop with a network
stream; the production hooks (``CommHooks``'s wrappers of those two FSDP methods, around fake param
groups) record a mark before and after each wait, and the production :class:`GpuMarks` resolves them.
The re-gathers run inside a real autograd backward, so "in backward" is what autograd says. The
doctor's waits are held to the fake's ground truth; virtual seconds, never this machine's load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpudoctor.analysis import analyze
from gpudoctor.analysis.comm import comm_figures
from gpudoctor.hooks.comm_hooks import CommHooks
from gpudoctor.hooks.device_clock import GpuMarks
from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import build_report
from tests.fake_cuda import FakeGpu
from tests.recording_builder import T0, RecordingBuilder
from tests.test_ddp_gpu_clock import StrictClock

torch = pytest.importorskip("torch")

UNITS = 4
FORWARD_S, BACKWARD_S, COPY_OUT_S, OPTIMIZER_S, REDUCE_SCATTER_S = 0.008, 0.016, 0.0005, 0.004, 0.004
STEPS = 30


@dataclass
class Fsdp:
    """The fake FSDP: a network stream beside the training stream, and each wait as FSDP2 queues it."""

    gpu: FakeGpu
    net_free: float = 0.0
    truth: dict[str, list[float]] = field(default_factory=lambda: {"gather": [], "gather_bwd": [], "rs": []})

    def unshard(self, gather_s: float) -> float:
        """``unshard()``: the all-gather starts on the network when the host issues it (or once the
        network is free); returns when it is done."""
        self.net_free = max(self.net_free, self.gpu.now) + gather_s
        return self.net_free

    def wait_for_unshard(self, done: float, in_backward: bool) -> None:
        """The training stream waits for the all-gather, then copies the parameters out."""
        before = max(self.gpu.now, self.gpu.busy_until)  # where the stream is when the wait is queued
        self.gpu.busy_until = max(self.gpu.busy_until, done)
        self.gpu.launch(COPY_OUT_S)
        waited = max(0.0, done - before) + COPY_OUT_S
        self.truth["gather"][-1] += waited
        if in_backward:
            self.truth["gather_bwd"][-1] += waited

    def reduce_scatter(self) -> None:
        self.net_free = max(self.net_free, self.gpu.busy_until) + REDUCE_SCATTER_S  # once the grads are computed

    def final_callback(self) -> None:
        before = max(self.gpu.now, self.gpu.busy_until)
        self.gpu.busy_until = max(self.gpu.busy_until, self.net_free)
        self.truth["rs"][-1] += max(0.0, self.net_free - before)


def play_fsdp(root: Path, gather_s: float, reshard: bool = True,
              mem_used_mib: float | None = None) -> tuple[Fsdp, StrictClock]:
    """The loop, ``STEPS`` steps; ``mem_used_mib``: NVML's samples of an 80 GB GPU at that peak."""
    gpu = FakeGpu(now=T0 + 1.0, busy_until=T0 + 1.0, queue_s=0.2)
    clock = StrictClock(gpu)
    b = RecordingBuilder(root, cores=8)
    rows = b.process(libs={"torch": "2.13.0"})
    rows[-1]["world_size"] = 8
    marks = GpuMarks(clock, rows.append, now=lambda: gpu.now)
    hooks = CommHooks(writer=None)  # type: ignore[arg-type]  # only the GPU clock's path is exercised
    hooks.gpu_marks = lambda: marks
    fsdp = Fsdp(gpu)
    group = SimpleNamespace(device=SimpleNamespace(type="cuda"), _all_gather_result=True)
    state = SimpleNamespace(_device=SimpleNamespace(type="cuda"))
    wait_for_unshard = hooks._wrap_fsdp_wait("gather", "device")(
        lambda g, done, in_backward: fsdp.wait_for_unshard(done, in_backward))

    def units(launch_s: float, in_backward: bool) -> None:
        """Each unit's all-gather waited for, the next one prefetched (issued before this unit's
        compute, as FSDP2 does), then its compute; in backward its reduce-scatter after it."""
        done = fsdp.unshard(gather_s)
        for k in range(UNITS):
            wait_for_unshard(group, done, in_backward)
            if k + 1 < UNITS:
                done = fsdp.unshard(gather_s)
            gpu.launch(launch_s)
            if in_backward:
                fsdp.reduce_scatter()
    final_callback = hooks._wrap_fsdp_wait("rs", "_device")(lambda s: fsdp.final_callback())

    class Backward(torch.autograd.Function):
        """A real autograd backward: the re-gathers inside it are "in backward" as autograd says."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            if reshard:
                units(BACKWARD_S, True)
            else:
                for _ in range(UNITS):
                    gpu.launch(BACKWARD_S)
                    fsdp.reduce_scatter()
            return grad

    start = gpu.now
    rows += [{"k": "loader", "t": start, "id": 1, "num_workers": 4, "batch_size": 8, "pin_memory": True,
              "prefetch_factor": 2, "persistent_workers": False, "params": ["dataset", "batch_size", "num_workers"]},
             {"k": "first_step", "t": start},
             {"k": "gpu_clock", "t": start, "device": "cuda:0", "source": "cuda_events"}]
    for n in range(1, STEPS + 1):
        for key in fsdp.truth:
            fsdp.truth[key].append(0.0)
        t0 = gpu.now
        marks.wait_start(t0)
        gpu.host(0.0005)
        rows.append({"k": "span", "c": "data_wait", "t0": t0, "dt": gpu.now - t0, "name": "DataLoader.__next__"})
        marks.wait_end()
        units(FORWARD_S, False)
        x = torch.ones(1, requires_grad=True)
        Backward.apply(x).sum().backward()
        final_callback(state)
        gpu.launch(OPTIMIZER_S)
        rows.append({"k": "step", "t": gpu.now, "n": n, "dt": 0.001})
        rows.append({"k": "comm", "t": gpu.now, "n": n, "micro": 0, "synced": 0, "buckets": 0, "bytes": 0,
                     "comm_s": 0.0, "exposed_s": None, "search_s": 0.0, "direct": UNITS * (3 if reshard else 2),
                     "direct_bytes": 0, "direct_s": 0.001, "fsdp": 2, "gather_bwd": UNITS if reshard else 0,
                     "gather_bwd_bytes": UNITS * 50_000_000 if reshard else 0, "gather_bwd_s": 0.0})
        marks.step_end(n)
    gpu.sync()
    marks.poll()
    b.duration_s = gpu.now - T0 + 0.5
    if mem_used_mib is not None:
        b.gpu_rows(util_pct=90.0, mem_used_mib=mem_used_mib)
    b.write()
    return fsdp, clock


def _steps(root: Path) -> list[dict[str, Any]]:
    p = analyze(load_recording(root)).primary
    assert p is not None and p.gpu_clock is not None
    return list(p.gpu_clock.steps)


def test_backward_all_gathers_waited_for_are_timed_on_the_gpu_clock_and_fire(tmp_path: Path) -> None:
    fsdp, clock = play_fsdp(tmp_path / "slow", gather_s=0.020)  # a gather outlasts a unit's compute
    steps = _steps(tmp_path / "slow")
    assert len(steps) == STEPS and all(s["gathers"] == 2 * UNITS and s["gathers_bwd"] == UNITS for s in steps)
    assert [s["gather_wait_s"] for s in steps] == pytest.approx(fsdp.truth["gather"], abs=1e-5)
    assert [s["gather_bwd_wait_s"] for s in steps] == pytest.approx(fsdp.truth["gather_bwd"], abs=1e-5)
    assert [s["rs_wait_s"] for s in steps] == pytest.approx(fsdp.truth["rs"], abs=1e-5)
    assert fsdp.truth["gather_bwd"][-1] > 0.03  # the scenario: the stream waits for most of each re-gather
    p = analyze(load_recording(tmp_path / "slow")).primary
    assert p is not None
    fig = comm_figures(p)
    assert fig is not None and fig.gather_clock == "gpu"
    assert fig.gather_bwd_s == pytest.approx(fsdp.truth["gather_bwd"][-1], abs=1e-5)
    # the stream's waits are communication, not compute: within 5% of the truth, never above it
    waited = sum(map(sum, fsdp.truth.values())) - sum(fsdp.truth["gather_bwd"])
    assert waited * 0.95 <= p.seconds("communication") <= waited + 1e-5
    f = {x["rule"]: x for x in build_report(load_recording(tmp_path / "slow"))["findings"]}["fsdp_backward_allgather"]
    assert "GPU's clock" in f["evidence"] and f["fix"]["config"] == {"reshard_after_forward": False}
    step = f["data"]["step_s"]
    bwd = fsdp.truth["gather_bwd"][-1]
    assert f["data"]["predicted_loop_speedup"] == pytest.approx(step / (step - bwd), abs=1e-3)
    assert f["data"]["extra_memory_mib"] == pytest.approx(UNITS * 50_000_000 / 2**20 * 7 / 8, rel=1e-3)
    assert clock.early_reads == 0  # never an event read before the GPU passed it
    assert clock.records == STEPS * (2 + 2 * (2 * UNITS) + 2)  # a loader wait, two per unshard, backward's end


def test_kept_parameters_and_a_fast_network_claim_nothing(tmp_path: Path) -> None:
    fsdp, _ = play_fsdp(tmp_path / "kept", gather_s=0.020, reshard=False)
    steps = _steps(tmp_path / "kept")
    assert all(s["gathers"] == UNITS and s["gathers_bwd"] == 0 for s in steps)
    assert "fsdp_backward_allgather" not in {f["rule"] for f in build_report(load_recording(tmp_path / "kept"))["findings"]}
    fsdp, _ = play_fsdp(tmp_path / "fast", gather_s=0.001)  # each re-gather hides behind the unit before it
    steps = _steps(tmp_path / "fast")
    assert [s["gather_bwd_wait_s"] for s in steps] == pytest.approx(fsdp.truth["gather_bwd"], abs=1e-5)
    assert "fsdp_backward_allgather" not in {f["rule"] for f in build_report(load_recording(tmp_path / "fast"))["findings"]}


def test_the_fix_is_set_beside_the_gpus_measured_memory(tmp_path: Path) -> None:
    """Keeping the gathered parameters costs memory: beside a low measured peak the fix says it fits;
    beside a peak near the GPU's size it is an info note that claims nothing, never a promise."""
    findings = {}
    for name, used in (("roomy", 4000.0), ("full", 80000.0)):
        play_fsdp(tmp_path / name, gather_s=0.020, mem_used_mib=used)
        report = build_report(load_recording(tmp_path / name))
        findings[name] = {f["rule"]: f for f in report["findings"]}["fsdp_backward_allgather"]
    roomy, full = findings["roomy"], findings["full"]
    assert roomy["data"]["fits"] is True and roomy["claims"] and roomy["severity"] != "info"
    assert "it fits" in roomy["fix"]["summary"]
    assert full["data"]["fits"] is False and full["severity"] == "info" and full["claims"] == []
    assert full["predicted_speedup"] is None and full["data"]["predicted_loop_speedup"] is None
    assert full["fix"]["summary"].startswith("No fix that fits")
