"""Evaluation and parameter updates in hand-written loops, as the hooks see them.

Real small loops on CPU with the hooks in (no mocks): an eval is forward passes of
the trained model without backward (under no_grad, or in eval mode), never a
training step in eval mode nor a frozen teacher's forward; a loop with no
optimizer still has its steps, from its backward passes and parameter updates.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.conftest import hooks_in

STEPS, EVERY, K = 12, 4, 3  # steps, eval every EVERY steps, K batches per eval


def hooked(loop: Callable[[], None]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gpudoctor-evalregions-") as name:
        folder = Path(name)
        with hooks_in(folder):
            loop()
        path = folder / "events" / f"{os.getpid()}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


def evals(events: list[dict[str, Any]]) -> int:
    return sum(e["k"] == "span" and e["c"] == "eval_loop" for e in events)


def steps(events: list[dict[str, Any]]) -> int:
    return sum(e["k"] == "step" for e in events)


def counter(events: list[dict[str, Any]], name: str) -> int:
    return sum(e["calls"] for e in events if e["k"] == "counter" and e["name"] == name)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def batch() -> torch.Tensor:
    return torch.randn(4, 8)


def test_no_grad_estimate_loss_between_steps_is_one_eval_each():
    def loop() -> None:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

        @torch.no_grad()
        def estimate_loss() -> float:
            net.eval()
            out = sum(float(net(batch()).mean()) for _ in range(K))
            net.train()
            return out

        for step in range(STEPS):
            if step % EVERY == 0:  # step 0 too: before the first training step
                estimate_loss()
            net(batch()).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)  # a no_grad block, not an eval
            opt.step()
            opt.zero_grad()

    events = hooked(loop)
    assert evals(events) == STEPS // EVERY
    assert counter(events, "eval_forwards") == STEPS // EVERY * K
    assert steps(events) == STEPS


def test_eval_mode_forwards_with_grad_on_are_an_eval_and_training_in_eval_mode_is_not():
    def eval_mode_eval() -> None:
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for step in range(STEPS):
            if step and step % EVERY == 0:
                net.eval()
                for _ in range(K):
                    net(batch())
                net.train()
            net(batch()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    def trains_in_eval_mode() -> None:  # dropout off for fine-tuning: every forward is followed by backward
        net = model().eval()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(STEPS):
            net(batch()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    assert evals(hooked(eval_mode_eval)) == (STEPS - 1) // EVERY
    trained = hooked(trains_in_eval_mode)
    assert evals(trained) == 0 and steps(trained) == STEPS


def test_a_frozen_teachers_no_grad_forward_is_training_not_eval():
    def distill() -> None:
        teacher = model().requires_grad_(False)
        student = model()
        opt = torch.optim.SGD(student.parameters(), lr=0.01)
        for _ in range(STEPS):
            x = batch()
            with torch.no_grad():
                target = teacher(x)
            (student(x) - target).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    events = hooked(distill)
    assert evals(events) == 0 and steps(events) == STEPS


def test_a_loop_without_optimizer_has_a_step_per_parameter_update():
    def plain_sgd() -> None:
        net = model()
        for _ in range(STEPS):
            net(batch()).pow(2).mean().backward()
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None

    events = hooked(plain_sgd)
    assert steps(events) == STEPS
    assert evals(events) == 0


class Wrapped(torch.nn.Module):
    """Like DDP: trains through the wrapper, evaluates the ``.module`` inside it."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_after_the_first_step_only_the_trained_models_are_hooked_and_evals_still_count():
    module_mod = torch.nn.modules.module
    global_hooks: list[int] = []

    def loop() -> None:
        raw = model()
        net = Wrapped(raw)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for step in range(STEPS):
            if step and step % EVERY == 0:
                with torch.no_grad():
                    for _ in range(K):
                        raw(batch())  # nanoGPT evaluates raw_model, not the DDP wrapper
            net(batch()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            global_hooks.append(len(module_mod._global_forward_pre_hooks)
                                + len(module_mod._global_forward_hooks))

    events = hooked(loop)
    # submodules keep torch's fast path: no global forward hook is left after step 1
    assert global_hooks == [0] * STEPS
    assert evals(events) == (STEPS - 1) // EVERY
    assert counter(events, "eval_forwards") == (STEPS - 1) // EVERY * K
    assert steps(events) == STEPS
