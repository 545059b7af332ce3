"""NVML sampling against a fake binding (no GPU needed), plus one real-GPU check.

Scenario: three GPUs; GPU 1 answers NotSupported for power and PCIe and hides
per-process memory; GPU 2 is lost mid-run. The training tree is pids 4242/4243.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pynvml
import pytest

from gpudoctor.recording import JsonlAppender
from gpudoctor.recording.store import read_jsonl
from gpudoctor.samplers import GpuSampler, Nvml
from tests import fake_nvml
from tests.fake_nvml import ERROR_CODES, FakeBinding, FakeGpu, NVMLError

GIB = 1024**3
TRAINING_PIDS = {4242, 4243}


def three_gpus() -> list[FakeGpu]:
    return [
        FakeGpu("Fake A100", "GPU-aaaa1111-0000", 80 * GIB, 40 * GIB, 97, 312_500, 1410,
                pcie_tx_kib_s=1000, pcie_rx_kib_s=2000,
                procs=[(4242, 10 * GIB), (9999, 1 * GIB)]),
        FakeGpu("Fake T4", "GPU-bbbb2222-0000", 16 * GIB, 1 * GIB, 5, 70_000, 585,
                procs=[(4243, None)],
                unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"}),
        FakeGpu("Fake V100", "GPU-cccc3333-0000", 32 * GIB, 0, 0, 40_000, 1380),
    ]  # fmt: skip


ROW_GPU0 = {
    "index": 0, "name": "Fake A100", "util_pct": 97.0, "mem_used_mib": 40960.0,
    "mem_total_mib": 81920.0, "power_w": 312.5, "sm_clock_mhz": 1410,
    "pcie_tx_kib_s": 1000, "pcie_rx_kib_s": 2000, "proc_mem_mib": 10240.0, "lost": False,
}  # fmt: skip
ROW_GPU1 = {
    "index": 1, "name": "Fake T4", "util_pct": 5.0, "mem_used_mib": 1024.0,
    "mem_total_mib": 16384.0, "power_w": None, "sm_clock_mhz": 585,
    "pcie_tx_kib_s": None, "pcie_rx_kib_s": None, "proc_mem_mib": None, "lost": False,
}  # fmt: skip
ROW_GPU2 = {
    "index": 2, "name": "Fake V100", "util_pct": 0.0, "mem_used_mib": 0.0,
    "mem_total_mib": 32768.0, "power_w": 40.0, "sm_clock_mhz": 1380,
    "pcie_tx_kib_s": 0, "pcie_rx_kib_s": 0, "proc_mem_mib": 0.0, "lost": False,
}  # fmt: skip
ROW_GPU2_LOST = {
    **ROW_GPU2,
    **{k: None for k in ("util_pct", "mem_used_mib", "power_w", "sm_clock_mhz")},
    **{k: None for k in ("pcie_tx_kib_s", "pcie_rx_kib_s", "proc_mem_mib")},
    "lost": True,
}


@pytest.fixture(params=["fake_errors", "real_pynvml_errors"])
def binding(request: pytest.FixtureRequest) -> FakeBinding:
    """Three fake GPUs, raising either the fake's or the real pynvml's error classes."""
    errors = pynvml if request.param == "real_pynvml_errors" else None
    return FakeBinding(three_gpus(), errors=errors)


@pytest.fixture
def sampler(binding: FakeBinding, tmp_path) -> GpuSampler:
    nvml = Nvml(binding, env={})
    assert nvml.init(), nvml.reason
    writer = JsonlAppender(tmp_path / "gpu.jsonl")
    s = GpuSampler(nvml, writer, pids_provider=lambda: set(TRAINING_PIDS),
                   pcie_interval_s=0.0, pcie_gpus_per_tick=8)  # fmt: skip
    yield s
    s.stop()


def rows_of(sampler: GpuSampler) -> list[dict]:
    sampler.writer.flush()
    rows, bad = read_jsonl(sampler.writer.path)
    assert bad == 0
    return rows


def test_rows_match_golden_and_unsupported_is_null(sampler: GpuSampler) -> None:
    sampler.tick()
    (row,) = rows_of(sampler)
    assert isinstance(row.pop("t"), float) and isinstance(row.pop("m"), float)  # wall and monotonic clocks
    assert row == {"gpus": [ROW_GPU0, ROW_GPU1, ROW_GPU2]}


def test_unsupported_is_reported_once_and_not_asked_again(
    sampler: GpuSampler, binding: FakeBinding
) -> None:
    for _ in range(3):
        sampler.tick()
    problems = sampler.problems()
    assert len(problems) == 2
    assert problems[0].startswith("GPU 1 (Fake T4): power is not supported")
    assert problems[1].startswith("GPU 1 (Fake T4): PCIe throughput is not supported")
    assert binding.calls.count(("nvmlDeviceGetPowerUsage", 1)) == 1
    assert binding.calls.count(("nvmlDeviceGetPcieThroughput", 1)) == 1
    assert [r["gpus"][1] for r in rows_of(sampler)] == [ROW_GPU1] * 3


def test_lost_gpu_is_marked_reported_once_and_left_alone(
    sampler: GpuSampler, binding: FakeBinding
) -> None:
    sampler.tick()
    binding.gpus[2].lost = True
    sampler.tick()
    calls_after_loss = len([c for c in binding.calls if c[1] == 2])
    sampler.tick()
    rows = rows_of(sampler)
    assert [r["gpus"][2] for r in rows] == [ROW_GPU2, ROW_GPU2_LOST, ROW_GPU2_LOST]
    assert [r["gpus"][0] for r in rows] == [ROW_GPU0] * 3  # the others go on
    lost = [p for p in sampler.problems() if "lost" in p]
    assert len(lost) == 1 and lost[0].startswith("GPU 2 (Fake V100) is lost (GPU is lost")
    assert len([c for c in binding.calls if c[1] == 2]) == calls_after_loss


def test_describe_gpus_for_the_report(sampler: GpuSampler) -> None:
    assert sampler.describe_gpus() == [
        {"index": 0, "name": "Fake A100", "memory_total_mib": 81920.0, "uuid": "GPU-aaaa1111-0000"},
        {"index": 1, "name": "Fake T4", "memory_total_mib": 16384.0, "uuid": "GPU-bbbb2222-0000"},
        {"index": 2, "name": "Fake V100", "memory_total_mib": 32768.0, "uuid": "GPU-cccc3333-0000"},
    ]


def test_thread_writes_rows_and_survives_a_failing_pid_provider(
    binding: FakeBinding, tmp_path
) -> None:
    calls = []

    def flaky_pids() -> set[int]:
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("process table unreadable")
        return set(TRAINING_PIDS)

    nvml = Nvml(binding, env={})
    assert nvml.init()
    sampler = GpuSampler(
        nvml, JsonlAppender(tmp_path / "gpu.jsonl"), interval_s=0.02, pids_provider=flaky_pids
    )
    sampler.start()
    time.sleep(0.25)
    sampler.stop()
    sampler.stop()  # idempotent
    rows, _ = read_jsonl(tmp_path / "gpu.jsonl")
    assert len(rows) >= 3 and rows[0]["gpus"][0] == ROW_GPU0  # GPU 0 has the first PCIe turn
    assert len(sampler.errors) == 1  # the same failure is kept once
    assert "RuntimeError: process table unreadable" in sampler.errors[0]
    assert not binding.initialized  # the sampler shut NVML down


@pytest.mark.parametrize(
    ("code_name", "words"),
    [
        ("NVML_ERROR_DRIVER_NOT_LOADED", "driver is not loaded"),
        ("NVML_ERROR_LIBRARY_NOT_FOUND", "no NVIDIA driver"),
        ("NVML_ERROR_NO_PERMISSION", "nvmlInit failed: Insufficient Permissions"),
    ],
)
def test_init_failure_gives_one_line_reason(code_name: str, words: str) -> None:
    nvml = Nvml(FakeBinding(three_gpus(), init_error=getattr(pynvml, code_name), errors=pynvml))
    assert nvml.init() is False
    assert words in nvml.reason and "sampling the host only" in nvml.reason
    assert "\n" not in nvml.reason
    assert nvml.problems() == [nvml.reason]
    assert nvml.indices == []


def test_init_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    nvml = Nvml()
    assert nvml.init() is False
    assert nvml.reason.startswith("nvidia-ml-py is not installed")


@pytest.mark.parametrize(
    ("visible", "indices", "n_problems"),
    [
        ("2,0", [2, 0], 0),
        ("GPU-cccc3333", [2], 0),  # a UUID prefix, as CUDA accepts
        ("GPU-bbbb2222-0000,0", [1, 0], 0),
        ("1,MIG-xyz,0", [1], 1),  # CUDA stops at the first entry naming no GPU
        ("0,7", [0], 1),
    ],
)
def test_cuda_visible_devices_limits_the_gpus(
    visible: str, indices: list[int], n_problems: int
) -> None:
    binding = FakeBinding(three_gpus())
    nvml = Nvml(binding, env={"CUDA_VISIBLE_DEVICES": visible})
    assert nvml.init()
    assert nvml.indices == indices
    assert len(nvml.problems()) == n_problems
    sampler = GpuSampler(nvml, None, pcie_interval_s=0.0, pcie_gpus_per_tick=8)
    assert [g["index"] for g in sampler.sample()["gpus"]] == indices
    hidden = set(range(3)) - set(indices)
    assert not [c for c in binding.calls if c[1] in hidden and c[0] != "nvmlDeviceGetUUID"]


@pytest.mark.parametrize("visible", ["", "-1"])
def test_no_visible_gpu_means_host_only(visible: str) -> None:
    nvml = Nvml(FakeBinding(three_gpus()), env={"CUDA_VISIBLE_DEVICES": visible})
    assert nvml.init() is False
    assert nvml.reason.startswith(f"CUDA_VISIBLE_DEVICES={visible!r} leaves no GPU visible")


def test_pcie_is_read_for_one_gpu_per_tick_by_default(binding: FakeBinding) -> None:
    """PCIe counters block ~20 ms each, so the default spreads them over ticks."""
    nvml = Nvml(binding, env={})
    assert nvml.init()
    sampler = GpuSampler(nvml, None, pcie_interval_s=10.0)
    measured = [
        [g["index"] for g in sampler.sample()["gpus"] if g["pcie_tx_kib_s"] is not None]
        for _ in range(4)
    ]
    assert measured == [[0], [], [2], []]  # GPU 1 is unsupported: its turn reads null


def test_fake_errors_match_the_real_binding() -> None:
    """The fake is only useful if it raises what nvidia-ml-py raises."""
    for code_name, code in fake_nvml.ERROR_CODES.items():
        assert getattr(pynvml, code_name) == code
        class_name = fake_nvml._class_name(code_name)
        assert isinstance(pynvml.NVMLError(code), getattr(pynvml, class_name))
        assert isinstance(fake_nvml.NVMLError(code), getattr(fake_nvml, class_name))
        assert getattr(fake_nvml, class_name)().value == code
    for name in ("NVML_CLOCK_SM", "NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES"):
        assert getattr(pynvml, name) == getattr(fake_nvml, name)


def _real_nvml_or_skip() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVML here: {exc}")
    pynvml.nvmlShutdown()


@pytest.mark.gpu
def test_real_gpu_rows(tmp_path) -> None:
    _real_nvml_or_skip()
    nvml = Nvml()
    assert nvml.init(), nvml.reason
    sampler = GpuSampler(nvml, JsonlAppender(tmp_path / "gpu.jsonl"), interval_s=0.05)
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    rows, bad = read_jsonl(tmp_path / "gpu.jsonl")
    assert bad == 0 and len(rows) >= 3 and not sampler.errors
    for gpu in rows[-1]["gpus"]:
        assert gpu["lost"] is False
        assert 0.0 <= gpu["util_pct"] <= 100.0
        assert 0.0 < gpu["mem_used_mib"] <= gpu["mem_total_mib"]
    assert all(
        g["name"] and g["uuid"].startswith(("GPU-", "MIG-")) for g in sampler.describe_gpus()
    )


class _BindingWithV2(FakeBinding):
    """nvidia-ml-py's ``nvmlDeviceGetMemoryInfo(handle, version)``: version 1's ``used`` holds the
    driver's reserved memory, version 2's does not (what nvidia-smi shows)."""

    nvmlMemory_v2 = 0x2000028
    RESERVED_B = 614 * 2**20

    def __init__(self, gpus: list[FakeGpu], v2_error: int | None = None) -> None:
        super().__init__(gpus)
        self.v2_error = v2_error

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> SimpleNamespace:  # type: ignore[override]
        v1 = super().nvmlDeviceGetMemoryInfo(handle)
        if version is None:
            return SimpleNamespace(total=v1.total, used=v1.used + self.RESERVED_B, free=v1.free - self.RESERVED_B)
        if self.v2_error is not None:
            raise NVMLError(self.v2_error)
        return SimpleNamespace(total=v1.total, used=v1.used, free=v1.free, reserved=self.RESERVED_B)


def test_memory_used_is_read_as_nvidia_smi_reads_it_version_2() -> None:
    """On an H200 version 1 said 3891.9 MiB where nvidia-smi said 3277 (bench/gpu_check.py)."""
    gpu = FakeGpu("NVIDIA H200", "GPU-2", 141 * 2**30, 3277 * 2**20, 100, 550_000, 1980)
    nvml = Nvml(binding=_BindingWithV2([gpu]))
    assert nvml.init()
    assert nvml.memory_used_mib(0) == 3277.0
    old = Nvml(binding=_BindingWithV2([gpu], v2_error=ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"]))
    assert old.init()
    assert old.memory_used_mib(0) == 3277.0 + 614 and old.memory_used_mib(0) == 3891.0  # version 1, asked again
    assert old.problems() == []  # a driver without version 2 is no problem: version 1 is read
