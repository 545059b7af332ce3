"""DDP in this process, one real rank (gloo, an in-memory store).

A model built before the doctor came in (``attach``, ``gpudoctor.profile()`` around a loop already
running) is adopted at its next training forward: its settings are recorded and its all-reduce
timed, through a detach and a second attach, and the training's gradients are untouched. And
``gpudoctor try``'s DDP arguments reach the call the script wrote."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import gpudoctor

torch = pytest.importorskip("torch")
dist = torch.distributed


def _events(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in (folder / "events").glob("*.jsonl")
            for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture()
def one_rank() -> Any:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _net() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def test_a_model_built_before_the_doctor_is_timed_through_a_detach_and_a_second_attach(
        one_rank: Any, tmp_path: Path) -> None:
    plain = _net()
    model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(plain))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, model)]
    x = torch.randn(16, 32)

    def train(steps: int) -> None:
        for _ in range(steps):
            for m, opt in zip((plain, model), opts, strict=True):
                m(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()

    train(2)  # built and trained before any doctor
    for folder in ("first", "second"):
        with gpudoctor.profile(out=tmp_path / folder, interval_s=0.05):
            train(5)
        train(2)  # detached
        assert not model._comm_hooks and not model._get_ddp_logging_data().get("comm_hook")  # nothing of ours in DDP's slot
    for folder in ("first", "second"):
        rows = _events(tmp_path / folder)
        ddp = [r for r in rows if r["k"] == "ddp"]
        assert len(ddp) == 1 and ddp[0]["world_size"] == 1 and ddp[0]["find_unused_parameters"] is False
        comm = [r for r in rows if r["k"] == "comm"]
        assert len(comm) == 5, folder
        assert all(r["micro"] == 1 and r["synced"] == 1 and r["buckets"] >= 1 and r["bytes"] > 0 for r in comm)
        assert all(r["exposed_s"] is not None for r in comm)  # timed from the first step, hookless
        assert not [r for r in rows if r["k"] == "hook_error"]
    for a, b in zip(plain.parameters(), model.module.parameters(), strict=True):  # one rank: the same arithmetic
        assert torch.equal(a, b)


def test_a_hook_the_script_registered_before_the_doctor_keeps_the_slot(one_rank: Any, tmp_path: Path) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = [0]

    def theirs(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not strings
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model = torch.nn.parallel.DistributedDataParallel(_net())
    model.register_comm_hook(None, theirs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05):
        for _ in range(4):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    rows = _events(tmp_path / "run")
    assert calls[0] == 4  # theirs ran every backward, nothing registered over it
    assert not [r for r in rows if r["k"] == "hook_error"]
    comm = [r for r in rows if r["k"] == "comm"]
    assert len(comm) == 4 and all(r["micro"] == 1 and r["synced"] == 1 and r["buckets"] == 0 for r in comm)


def test_try_sets_the_ddp_argument_in_the_call_the_script_wrote(
        one_rank: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpudoctor try``'s fix for unused_parameter_search reaches ``DistributedDataParallel(...)``
    through the hooks: the model is built with find_unused_parameters=False, and an ``applied``
    event says what it was."""
    from gpudoctor import hooks
    from gpudoctor.hooks import apply

    spec = {"schema": apply.SCHEMA, "rule": "unused_parameter_search", "ddp": {"find_unused_parameters": False}}
    monkeypatch.setattr(apply, "_overrides", apply.Overrides(spec))  # what GPUDOCTOR_APPLY's file gives
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05):
        monkeypatch.setattr(apply, "_writer", hooks.writer())
        model = torch.nn.parallel.DistributedDataParallel(_net(), find_unused_parameters=True)
        model(torch.randn(4, 32)).sum().backward()
    assert model.find_unused_parameters is False
    applied = [r for r in _events(tmp_path / "run") if r["k"] == "applied"]
    assert [(a["call"], a["values"], a["was"]) for a in applied] == [
        ("DistributedDataParallel", {"find_unused_parameters": False}, {"find_unused_parameters": True})]
    ddp = [r for r in _events(tmp_path / "run") if r["k"] == "ddp"]
    assert ddp[0]["find_unused_parameters"] is False  # the settings recorded are those that ran


def test_try_all_reduces_once_per_accumulation_and_builds_ddp_as_written(
        one_rank: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpudoctor try``'s no_sync fix: DDP's switch is set before each training forward, so 4
    micro-steps all-reduce once; the DDP call itself, with nothing of its own to change, is built as
    written. The weights equal a plain model's trained on the same micro-batches."""
    from gpudoctor import hooks
    from gpudoctor.hooks import apply

    spec = {"schema": apply.SCHEMA, "rule": "sync_every_microstep", "ddp_sync": {"every": 4}}
    monkeypatch.setattr(apply, "_overrides", apply.Overrides(spec))
    plain = _net()
    xs = [torch.randn(4, 32) for _ in range(8)]
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05):
        monkeypatch.setattr(apply, "_writer", hooks.writer())
        model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=1)
        for m in (plain, model):
            opt = torch.optim.SGD(m.parameters(), lr=0.05)
            for i, x in enumerate(xs):
                m(x).pow(2).mean().backward()
                if i % 4 == 3:
                    opt.step()
                    opt.zero_grad()
    rows = _events(tmp_path / "run")
    comm = [r for r in rows if r["k"] == "comm"]
    assert [(r["micro"], r["synced"]) for r in comm[-2:]] == [(4, 1), (4, 1)]  # the DDP model's two steps
    assert [r["call"] for r in rows if r["k"] == "applied"] == ["model.no_sync"]
    for a, b in zip(plain.parameters(), model.module.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_no_sync_fix_is_a_plan_try_can_carry_out_whole() -> None:
    """``sync_every_microstep``'s fix is the script's own loop (``no_sync()``), yet the trial can set
    DDP's switch: the plan hands the hooks the accumulation the baseline measured, nothing else."""
    from typing import cast

    from gpudoctor.core.schema import Finding
    from gpudoctor.rules.names import Names
    from gpudoctor.tryfix.plan import _plan

    finding = cast(Finding, {"rule": "sync_every_microstep", "data": {"micro_steps": 4},
                             "fix": {"library": "torch DistributedDataParallel", "call": "model.no_sync", "config": {}}})
    plan = _plan(finding, Names("loop", "torch", set(), set(), {}, None), cast(Any, None), {})
    assert plan.complete and [p.call for p in plan.parts] == ["model.no_sync"]
    assert plan.spec()["ddp_sync"] == {"every": 4}
