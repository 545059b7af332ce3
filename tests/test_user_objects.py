"""Nothing of the doctor's is left on the user's objects (issue #39).

A model saved whole (``torch.save(model)``), copied for an EMA (``copy.deepcopy``) or scripted after
the first optimizer step must behave as it does without the doctor: no hook, attribute or closure
of ours on it. In-process, with the hooks installed as ``gpudoctor run`` installs them.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpudoctor import hooks
from tests.conftest import hooks_in


@pytest.fixture
def doctor() -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix="gpudoctor-userobjects-") as name, hooks_in(Path(name)):
        yield


def _trained(steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(steps):
        net(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return net, opt


def _hooks_on(net: torch.nn.Module) -> list[str]:
    found = []
    for name, m in net.named_modules():
        for slot in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            if getattr(m, slot, None):
                found.append(f"{name or '<top>'}.{slot}")
    return found


def test_a_model_after_its_first_steps_pickles_copies_and_scripts_as_without_the_doctor(doctor: None) -> None:
    net, opt = _trained()
    assert _hooks_on(net) == []
    buf = io.BytesIO()
    torch.save(net, buf)  # the whole module, as word_language_model saves it each epoch
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    ema = copy.deepcopy(net)  # how EMA and averaged models are made
    averaged = torch.optim.swa_utils.AveragedModel(net)
    pickle.loads(pickle.dumps(opt))  # the optimizer, pickled whole
    scripted = torch.jit.script(net)
    x = torch.randn(3, 8)
    with torch.no_grad():  # an eval of the copies after their making, the doctor still in
        for other in (loaded, ema, averaged, scripted):
            assert torch.equal(other(x), net(x))
    assert _hooks_on(ema) == [] and _hooks_on(loaded) == []


def test_the_eval_of_a_trained_model_is_still_found_after_its_first_step(doctor: None) -> None:
    net, opt = _trained()
    with torch.no_grad():
        net.eval()
        net(torch.randn(4, 8))
        net.train()
    w = hooks.writer()
    assert w is not None
    w.flush()
    assert '"eval_loop"' in (w.run_dir / "events" / f"{os.getpid()}.jsonl").read_text()


def test_the_trainer_callback_the_hooks_add_leaves_a_plain_one_in_a_copy(doctor: None) -> None:
    transformers = pytest.importorskip("transformers")
    from gpudoctor.hooks.hf_callback import EventsCallback

    ours = EventsCallback(hooks.writer())
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(copied) is transformers.TrainerCallback
