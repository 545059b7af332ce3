"""The GPU's own clock (issue #25): the trap, a sync-bound loop and a real stall, replayed
through a fake CUDA stream (tests/fake_cuda.py), judged on the GPU's seconds.

No GPU here: the fake sits at the DeviceClock boundary, as NVML's fake sits at its binding.
The figures are virtual seconds, so they are exact and never depend on this machine's load.
Each prediction is checked against the same fake with the fix applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudoctor import hooks
from gpudoctor.analysis import analyze
from gpudoctor.hooks.device_clock import GpuMarks
from gpudoctor.recording.store import load_recording
from gpudoctor.render.html import HtmlRenderer
from gpudoctor.render.markdown import render_report
from gpudoctor.render.terminal import summary_lines
from gpudoctor.report.build import build_report
from gpudoctor.report.check import problem
from gpudoctor.rules.data import data_wait, worker_fix
from tests.conftest import hooks_in
from tests.fake_cuda import PATTERNS, FakeClock, FakeGpu, replay
from tests.recording_builder import RecordingBuilder


def _report(name: str, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], Any]:
    played = replay(name, tmp_path / name, **kw)
    return build_report(load_recording(played.root)), played


def _rules(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in report["findings"]}


def _fixed_step_s(name: str, tmp_path: Path, **changes: Any) -> float:
    """GPU seconds per step of pattern ``name`` with ``changes`` applied, from the fake's ground truth."""
    import dataclasses

    PATTERNS[f"{name}_fixed"] = dataclasses.replace(PATTERNS[name], **changes)
    try:
        played = replay(f"{name}_fixed", tmp_path / f"{name}_fixed")
    finally:
        del PATTERNS[f"{name}_fixed"]
    return played.loop_s / played.steps


def test_the_trap_is_no_data_stall_and_workers_promise_little(tmp_path: Path) -> None:
    report, played = _report("trap", tmp_path)
    g = report["gpu_timeline"]
    # The host sees over half its time "waiting for data"; the GPU was busy through it.
    assert g["host_breakdown"]["data_wait"] > 0.45
    assert report["breakdown"]["data_wait"] < 0.02
    assert g["busy_fraction"] > 0.95 and played.true_busy > 0.95
    assert "data_stall" not in _rules(report)
    d = data_wait(analyze(load_recording(played.root)))
    assert d is not None and d.batch_s is not None
    _, _, predicted = worker_fix(d)
    assert predicted is not None
    assert d.batch_s / predicted[1] <= 1.1  # what workers could give, at best
    # and what they do give on the fake: a batch built by workers leaves the GPU step as it was
    now = played.loop_s / played.steps
    assert now / _fixed_step_s("trap", tmp_path, build_s=0.0005, num_workers=4) <= 1.1


def test_a_real_stall_gets_workers_and_a_prediction_the_fix_keeps(tmp_path: Path) -> None:
    report, played = _report("stall", tmp_path)
    stall = _rules(report)["data_stall"]
    assert stall["data"]["recommended_workers"] == 3
    assert stall["fix"]["config"]["num_workers"] == 3
    assert report["breakdown"]["data_wait"] > 0.4  # the GPU idled in the waits
    d = data_wait(analyze(load_recording(played.root)))
    assert d is not None and d.batch_s is not None
    _, _, predicted = worker_fix(d)
    assert predicted is not None
    promised = d.batch_s / predicted[0]
    measured = (played.loop_s / played.steps) / _fixed_step_s("stall", tmp_path, build_s=0.0005, num_workers=3)
    assert abs(promised - measured) / measured <= 0.2, (promised, measured)


def test_a_sync_bound_loop_gets_host_sync_and_a_prediction_the_fix_keeps(tmp_path: Path) -> None:
    report, played = _report("sync", tmp_path)
    rules = _rules(report)
    assert "data_stall" not in rules and "low_gpu_utilization" not in rules
    sync = rules["host_sync"]
    assert sync["data"]["syncs_per_step"] == 1.0
    assert ".item()" in sync["fix"]["snippet"]
    promised_s = sync["data"]["predicted_gpu_step_ms"] / 1000
    measured_s = _fixed_step_s("sync", tmp_path, sync_python_s=None)
    assert abs(promised_s - measured_s) / measured_s <= 0.2, (promised_s, measured_s)
    assert report["gpu_timeline"]["syncs_per_step"] == 1.0
    # the parts of compute the findings claim (idle after syncs, busy) are disjoint seconds
    parts = {c["part"]: c["part_share"] for f in report["findings"] for c in f["claims"] if c["bucket"] == "compute"}
    assert "sync_idle" in parts and sum(parts.values()) <= 1.0 + 1e-3


def test_a_save_claims_only_the_gpu_part_and_its_prediction_the_fix_keeps(tmp_path: Path) -> None:
    """``torch.save`` of CUDA tensors first waits for the queued step: the host times that as
    saving, the GPU spent it computing. ``checkpoint`` is the save's part on the GPU (its copies
    and the idle while it writes), and saving less often is predicted from it."""
    report, played = _report("save", tmp_path)
    p = PATTERNS["save"]
    saves = played.steps // p.save_every
    # the host's save includes the GPU finishing the step queued before it; the GPU's does not
    host = report["gpu_timeline"]["host_breakdown"]["checkpoint"]
    wall_s = analyze(load_recording(played.root)).duration_s
    truth_s = saves * (p.save_copy_s + p.save_write_s)  # GPU seconds not on training: copy, then idle
    assert report["breakdown"]["checkpoint"] == pytest.approx(truth_s / wall_s, rel=0.01)
    assert host > report["breakdown"]["checkpoint"] + 0.05
    saving = _rules(report)["checkpoint_overhead"]
    assert saving["data"]["per_save_s"] == pytest.approx(p.save_copy_s + p.save_write_s, abs=0.005)
    every = saving["fix"]["config"]["save_steps"]
    assert every > p.save_every
    # the fake with the fix applied: the whole run's speed-up, as the finding promises it
    import dataclasses

    PATTERNS["save_fixed"] = dataclasses.replace(p, save_every=every)
    try:
        fixed = replay("save_fixed", tmp_path / "save_fixed")
    finally:
        del PATTERNS["save_fixed"]
    measured = wall_s / analyze(load_recording(fixed.root)).duration_s
    assert abs(saving["predicted_speedup"] - measured) / measured <= 0.2, (saving["predicted_speedup"], measured)
    # the GPU's time not on training is the saves' (explained by their marks), claimed once
    timed, inside = played.steps - 1, (played.steps - 1) // p.save_every  # steps 2..n: saves between them
    busy_s = timed * p.gpu_step_s
    saving_s = inside * (p.save_copy_s + p.save_write_s)
    assert report["gpu_timeline"]["busy_fraction"] == pytest.approx(busy_s / (busy_s + saving_s), abs=0.005)
    assert "low_gpu_utilization" not in _rules(report) and "gpu_memory_underused" not in _rules(report)


def test_a_step_with_one_wait_costs_two_records(tmp_path: Path) -> None:
    """The step's reference on the GPU is its first wait's end (``W1``): a loop with one batch per
    step records two events a step, and the GPU step times still add up to the GPU's own time."""
    gpu = FakeGpu()
    clock = FakeClock(gpu)
    out: list[dict[str, Any]] = []
    marks = GpuMarks(clock, out.append, now=lambda: gpu.now)
    steps = 50
    for n in range(1, steps + 1):
        marks.wait_start(gpu.now)
        gpu.host(0.03 if n % 2 else 0.001)  # a slow batch every other step: the GPU idles
        marks.wait_end()
        gpu.launch(0.02)
        marks.step_end(n)
    gpu.sync()
    marks.poll()
    assert clock.records == 2 * steps
    timed = [e for e in out if e["k"] == "gpu_step" and e["gpu_s"] is not None]
    assert len(timed) == steps - 1
    first_w1 = next(e for e in out if e["k"] == "gpu_wait")
    idle = [e["idle_s"] for e in out if e["k"] == "gpu_wait"]
    # from the first step's reference (its W1) to the last's, the GPU ran 49 steps and idled in 49 waits
    assert sum(e["gpu_s"] for e in timed) == pytest.approx(49 * 0.02 + sum(idle[1:]), abs=1e-6)
    assert first_w1["idle_s"] == pytest.approx(0.03, abs=1e-6)
    assert sum(e["wait_idle_s"] for e in timed) == pytest.approx(sum(idle[1:]), abs=1e-9)
    # a loop with no loader wait (synthetic batches) records one event at each step end instead
    gpu2 = FakeGpu()
    clock2 = FakeClock(gpu2)
    marks2 = GpuMarks(clock2, out.append, now=lambda: gpu2.now)
    for n in range(1, 11):
        gpu2.launch(0.02)
        marks2.step_end(n)
    assert clock2.records == 10


def test_a_tokenizer_the_gpu_waits_for_is_claimed_only_for_the_gpu_idle(tmp_path: Path) -> None:
    """The batch build is tokenizing on the main process: in the trap the GPU never waits for it
    (no finding); in the stall pre-tokenizing gives back the GPU's idle, not the host's seconds."""
    trap, _ = _report("trap", tmp_path, tokenize=True)
    assert "tokenization_in_loop" not in _rules(trap) and "data_stall" not in _rules(trap)
    stall, played = _report("stall", tmp_path, tokenize=True)
    tok = _rules(stall)["tokenization_in_loop"]
    idle_s = stall["gpu_timeline"]["data_wait_gpu_idle_s"]
    assert tok["data"]["tokenize_in_loop_s"] == pytest.approx(idle_s, abs=0.01)
    assert [c["bucket"] for c in tok["claims"] if c["fraction"] > 0] == ["data_wait"]
    host_s = 0.060 * played.steps
    assert idle_s < 0.8 * host_s  # the host's figure would have promised more


def test_mfu_is_in_every_format_on_a_gpu_run(tmp_path: Path) -> None:
    report, _ = _report("trap", tmp_path)
    mfu = report["mfu"]
    assert mfu["value"] is not None and 0 < mfu["value"] < 1
    inputs = mfu["inputs"]
    assert inputs["precision"] == "bf16" and inputs["gpu"] == "h100-sxm"
    assert inputs["tokens_per_step"] == 8 * 512
    # 6N + attention per token, as the workload model computes it
    per_token = 6 * 124e6 + 12 * 12 * 768 * 512
    assert inputs["flops_per_step"] == pytest.approx(4096 * per_token)
    assert mfu["value"] == pytest.approx(inputs["flops_per_step"] / inputs["gpu_step_s"] / 989.4e12, abs=1e-4)
    shown = f"{100 * mfu['value']:.1f}%"
    assert problem(json.loads(json.dumps(report))) is None
    assert shown in render_report(report)
    assert shown in HtmlRenderer().render(report)
    assert any(shown in line for line in summary_lines(report, tmp_path))
    low = _rules(report)["low_mfu"]  # busy, and far under what bf16 reaches
    # a 2x batch fits (30 of 80 GiB): the workload model's AdamW step (28 bytes per parameter at
    # 70% of 3350 GB/s) is paid once per step, so per token half of it goes
    optimizer_s = 124e6 * 28 / (3350e9 * 0.7)
    batch = low["data"]["levers"][0]
    assert batch["lever"].startswith("a 2x batch")
    assert batch["busy_per_token_removed"] == pytest.approx(optimizer_s / 2 / inputs["gpu_step_s"], abs=1e-4)
    # fused AdamW and compile: a range each, with its basis. Fused: the same step at 28 instead of
    # 80 bytes per parameter (torch's foreach AdamW), 0 if the optimizer is fused already (not recorded)
    fused, compiled = low["data"]["levers"][1:]
    assert fused["busy_per_token_removed"] is None and compiled["busy_per_token_removed"] is None
    busy_s = report["gpu_timeline"]["busy_fraction"] * inputs["gpu_step_s"]
    assert fused["range"] == pytest.approx([0.0, 124e6 * (80 - 28) / (3350e9 * 0.7) / busy_s], abs=1e-4)
    assert "bytes" in fused["basis"] and "fused already" in fused["basis"]
    # compile: from 0 to the busy time the reachable MFU would not need
    assert compiled["range"] == pytest.approx([0.0, 1 - mfu["value"] / inputs["reachable_mfu"]], abs=1e-3)
    assert "reachable MFU" in compiled["basis"]
    assert low["predicted_speedup_range"][1] > low["predicted_speedup"]


def test_a_fused_adamw_is_one_value_when_the_trainer_says_its_optimizer_is_not_fused(tmp_path: Path) -> None:
    """A Trainer's ``optim`` says what ran: foreach AdamW gets one predicted value and the config to
    change; a fused one already gets no fused lever (never the value that already ran)."""
    args = {"per_device_train_batch_size": 8, "optim": "adamw_torch", "bf16": True}
    report, _ = _report("trap", tmp_path, trainer_args=args)
    low = _rules(report)["low_mfu"]
    fused = next(lv for lv in low["data"]["levers"] if "fused" in lv["lever"])
    busy_s = report["gpu_timeline"]["busy_fraction"] * report["mfu"]["inputs"]["gpu_step_s"]
    assert fused["busy_per_token_removed"] == pytest.approx(124e6 * (80 - 28) / (3350e9 * 0.7) / busy_s, abs=1e-4)
    assert fused["range"] is None
    assert low["fix"]["config"]["optim"] == "adamw_torch_fused"
    already, _ = _report("trap", tmp_path / "fused", trainer_args={**args, "optim": "adamw_torch_fused"})
    low = _rules(already)["low_mfu"]
    assert not [lv for lv in low["data"]["levers"] if "fused" in lv["lever"]]
    assert "optim" not in low["fix"]["config"]


def test_mfu_is_null_with_a_reason_on_a_cpu_run(tmp_path: Path) -> None:
    b = RecordingBuilder(tmp_path / "cpu")
    rows = b.process()
    b.training_loop(rows, start_s=5, steps=50, compute_s=0.5, wait_s=0.1, fetch_s=0.1)
    report = build_report(load_recording(b.write()))
    assert report["mfu"]["value"] is None and "CUDA events" in report["mfu"]["reason"]
    assert report["gpu_timeline"] is None
    assert "unavailable" in render_report(report) and "MFU" in render_report(report)
    assert any("MFU unavailable" in line for line in summary_lines(report, tmp_path))
    assert "unavailable: no CUDA events recorded" in HtmlRenderer().render(report)
    assert problem(json.loads(json.dumps(report))) is None  # null with its reason is valid JSON


def test_nvml_disagreeing_with_the_events_is_said_and_the_events_trusted(tmp_path: Path) -> None:
    played = replay("stall", tmp_path / "stall")
    gpu_file = played.root / "samples" / "gpu.jsonl"
    rows = [json.loads(line) for line in gpu_file.read_text().splitlines()]
    for r in rows:  # another process keeps the GPU busy: NVML says 100%
        r["gpus"][0]["util_pct"] = 100.0
    gpu_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(load_recording(played.root))
    g = report["gpu_timeline"]
    assert g["nvml_windows"] and not all(w["agree"] for w in g["nvml_windows"])
    assert "trusts the CUDA events" in g["nvml_verdict"]
    assert any("trusts the CUDA events" in n for n in report["notes"])
    assert "data_stall" in _rules(report)  # the idle is still the events'


def test_nvml_agreeing_with_the_events_is_not_flagged(tmp_path: Path) -> None:
    report, _ = _report("sync", tmp_path)
    assert report["gpu_timeline"]["nvml_windows"]
    assert report["gpu_timeline"]["nvml_verdict"] is None


class _Immediate:
    """A device clock whose events complete at once (host time): the hooks' wiring, not timing."""

    def __init__(self) -> None:
        self.gpu = FakeGpu()
        self.clock = FakeClock(self.gpu)

    def record(self) -> Any:
        self.gpu.now += 1e-6
        return self.clock.record()

    def query(self, handle: Any) -> bool:
        return self.clock.query(handle)

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return self.clock.elapsed_ms(a, b)

    def capturing(self) -> bool:
        return False


def test_the_hooks_mark_each_wait_step_and_sync_of_a_real_loop(tmp_path: Path) -> None:
    """A real CPU loop, the fake clock in place of CUDA: one gpu_wait per batch, one gpu_step per
    step, one sync per ``.item()``; on a CPU run without it nothing GPU is written."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def loop(gpu_clock: bool) -> list[dict[str, Any]]:
        folder = tmp_path / ("gpu" if gpu_clock else "cpu")
        with hooks_in(folder):
            if gpu_clock:
                th = hooks.active_torch_hooks()
                assert th is not None
                th.start_gpu_clock("cpu", _Immediate())
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
            saved: list[int] = []
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for x, y in DataLoader(data, batch_size=8):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()
                if len(saved) < 2:
                    torch.save(model.state_dict(), tmp_path / f"{folder.name}-{len(saved)}.pt")
                    saved.append(1)
        return [json.loads(line) for f in (folder / "events").glob("*.jsonl") for line in f.read_text().splitlines()]

    events = loop(gpu_clock=True)
    kinds = [e["k"] for e in events]
    steps = [e for e in events if e["k"] == "gpu_step"]
    assert kinds.count("step") == 8 and len(steps) == 8
    assert kinds.count("gpu_wait") == 9  # 8 batches and the wait that ended the epoch
    # the .item() after step n is seen in step n+1 (the sync comes after the step's end); the
    # first step also holds what torch itself read back while setting up (counted here on CPU)
    assert [s["syncs"] for s in steps[1:]] == [1] * 7
    assert steps[0]["gpu_s"] is None and all(isinstance(s["gpu_s"], float) for s in steps[1:])
    assert kinds.count("gpu_clock") == 1
    assert kinds.count("gpu_save") == 2  # each torch.save of the loop, marked on the GPU clock
    assert sum(1 for e in events if e["k"] == "span" and e["c"] == "checkpoint") == 2
    plain = loop(gpu_clock=False)
    assert not [e for e in plain if str(e["k"]).startswith("gpu_")]


def test_the_wait_that_ends_each_epoch_is_no_batch(tmp_path: Path) -> None:
    """On the H200 the MFU of a 40-step loop over 8 batches an epoch read 10% high: the five
    epoch-ending waits (``StopIteration``) were counted as batches, so tokens per step too. A real
    loop of 3 epochs of 4 batches: 15 waits, 12 batches, in both of the reader's paths."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpudoctor.analysis.process import build_process_view
    from gpudoctor.core.events import NO_BATCH_WAIT
    from gpudoctor.recording.read import read_events
    from gpudoctor.recording.records import Records

    with hooks_in(tmp_path / "run"):
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
        for _ in range(3):
            for x, y in loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    (path,) = (tmp_path / "run" / "events").glob("*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    waits = [e for e in events if e["k"] == "span" and e["c"] == "data_wait"]
    assert len(waits) == 15 and sum(e["name"] == NO_BATCH_WAIT for e in waits) == 3
    one_by_one = Records()  # each line as validate's generic path hands it over (ints, odd extras)
    for e in events:
        one_by_one.add(e)
    as_dicts = build_process_view(1, one_by_one.finish(), 0.0, 1e12, [])
    compact = build_process_view(1, read_events(path).records, 0.0, 1e12, [])
    assert as_dicts.n_data_waits == compact.n_data_waits == 12 == len(compact.step_times)


def test_only_copies_onto_the_gpu_are_timed_not_casts() -> None:
    """``.to(dtype)`` and host copies are everywhere in a model: they must not cost an event."""
    import torch

    from gpudoctor.hooks.cuda_clock import _to_device

    assert _to_device(("cuda",), {}, "cuda") and _to_device(("cuda:1",), {}, "cuda")
    assert _to_device((torch.device("cuda", 0),), {}, "cuda")
    assert _to_device((), {"dtype": torch.float16, "device": torch.device("cuda")}, "cuda")
    assert not _to_device((torch.float16,), {}, "cuda")
    assert not _to_device(("cpu",), {}, "cuda")
    assert not _to_device((torch.zeros(1),), {}, "cuda")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (none on CI)")
def test_cuda_events_time_a_wait_the_gpu_spent_busy() -> None:
    """On a real GPU: a host wait behind a long kernel is ~0 GPU idle; one after it drained is idle."""
    import time

    import torch

    from gpudoctor.hooks.device_clock import CudaClock

    out: list[dict[str, Any]] = []
    marks = GpuMarks(CudaClock(torch), out.append)
    x = torch.randn(8192, 8192, device="cuda")
    for n in range(1, 4):
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)  # queue well over 50 ms of work
        marks.wait_start()
        time.sleep(0.005)  # the host "waits" while the GPU is busy
        marks.wait_end()
        marks.step_end(n)
    torch.cuda.synchronize()
    marks.wait_start()
    time.sleep(0.05)  # now the GPU is idle through the wait
    marks.wait_end()
    marks.step_end(4)
    torch.cuda.synchronize()
    marks.poll()
    waits = [e["idle_s"] for e in out if e["k"] == "gpu_wait"]
    assert len(waits) == 4 and max(waits[:3]) < 0.002 and waits[3] > 0.04


def test_no_event_is_recorded_while_a_cuda_graph_is_captured() -> None:
    """A timing event on a capturing stream would break the training's graph: such marks are left
    out, and the step after is timed from the next step end, not across the gap."""
    gpu = FakeGpu()
    clock = FakeClock(gpu)
    out: list[dict[str, Any]] = []
    marks = GpuMarks(clock, out.append, now=lambda: gpu.now)
    for n in range(1, 7):
        clock.capture = n in (3, 4)
        marks.wait_start(gpu.now)
        gpu.host(0.01)
        marks.wait_end()
        gpu.launch(0.05)
        marks.step_end(n)
    clock.capture = False
    gpu.sync()
    marks.poll()
    steps = [e for e in out if e["k"] == "gpu_step"]
    assert [s["n"] for s in steps] == [1, 2, 5, 6]
    assert [s["gpu_s"] is None for s in steps] == [True, False, True, False]
    assert len([e for e in out if e["k"] == "gpu_wait"]) == 4


def test_nothing_is_queried_while_a_whole_step_is_captured() -> None:
    """Whole-iteration capture (``optimizer.step()`` inside ``torch.cuda.graph``): the step end's
    read-back must not ``query()`` an event mid-capture (on a GPU that invalidates the capture and
    the training fails; issue #34, row 6). The marks still pending are read after the capture."""
    gpu = FakeGpu()
    clock = FakeClock(gpu)
    out: list[dict[str, Any]] = []
    marks = GpuMarks(clock, out.append, now=lambda: gpu.now)
    for n in range(1, 5):
        clock.capture = n == 3  # step 2's marks are still queued on the GPU when step 3 captures
        marks.wait_start(gpu.now)
        gpu.host(0.01)
        marks.wait_end()
        gpu.launch(0.05, launch_s=0.001)
        marks.step_end(n)
    clock.capture = False
    gpu.sync()
    marks.poll()
    assert clock.queries_in_capture == 0
    assert [e["n"] for e in out if e["k"] == "gpu_step"] == [1, 2, 4]
