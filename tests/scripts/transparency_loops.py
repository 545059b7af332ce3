"""Small training loops whose results must be bit-identical bare and under the doctor (issue #39).

``python transparency_loops.py OUT [--profile DIR] [CASE ...]``: one interpreter runs every case
(or those named), each in a forked child (``_transparency.py``), and writes one JSON line per case to OUT: the sha256 of its final weights (and of
any copy it made), and of what the user sees of the model (``repr``, ``state_dict`` keys, names).
``--profile DIR`` wraps each case's steps after the first in ``gpudoctor.profile()`` (what
``attach`` does to a loop already running), so detaching must leave nothing behind either.
Each case does what a user's loop does after its first optimizer step: saves the whole model,
deep-copies it for an EMA, pickles the optimizer, scripts or exports the model.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import pickle
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from _transparency import run_forked
from torch.utils.checkpoint import checkpoint

STEPS = 4
_profile_dir: Path | None = None


class Net(torch.nn.Module):
    def __init__(self, ckpt: bool | None = None) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(12, 32)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU())
                                          for _ in range(2))
        self.drop = torch.nn.Dropout(0.1)
        self.out = torch.nn.Linear(32, 3)
        self.ckpt = ckpt  # None: no gradient checkpointing; else use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.inp(x))
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.ckpt) if self.ckpt is not None and self.training else block(h)
        return self.out(h)


class Square(torch.autograd.Function):
    """A custom autograd function with its own backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def loader(n: int = STEPS) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(n * 8, 12, generator=g), torch.randn(n * 8, 3, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))


def digest(*models: torch.nn.Module, extra: object = None) -> str:
    h = hashlib.sha256()
    for m in models:
        for t in m.state_dict().values():
            h.update(t.detach().float().contiguous().numpy().tobytes())
    if extra is not None:
        h.update(repr(extra).encode())
    return h.hexdigest()


def seen(model: torch.nn.Module) -> str:
    """What the user sees of the model: its repr, state_dict keys, named parameters/modules/buffers."""
    return digest(extra=(repr(model), list(model.state_dict()), [n for n, _ in model.named_parameters()],
                         [n for n, _ in model.named_modules()], [n for n, _ in model.named_buffers()]))


def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, *, after_first: Callable[[], None] = lambda: None,
          loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          autocast: Callable[[], AbstractContextManager[Any]] = nullcontext, scaler: Any = None,
          epochs: int = 1, at_epoch_end: Callable[[int], None] = lambda e: None) -> None:
    """The loop: after the first step (``after_first``), the rest under ``gpudoctor.profile()`` if asked."""
    loss_of = loss_of or (lambda out, y: torch.nn.functional.mse_loss(out, y))
    batches = iter(_epochs(epochs, at_epoch_end))
    _one_step(model, opt, next(batches), loss_of, autocast, scaler)
    after_first()
    with _profiled():
        for batch in batches:
            _one_step(model, opt, batch, loss_of, autocast, scaler)


def _epochs(epochs: int, at_epoch_end: Callable[[int], None]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for e in range(epochs):
        yield from loader()
        at_epoch_end(e)


def _one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor],
              loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              autocast: Callable[[], AbstractContextManager[Any]], scaler: Any) -> None:
    x, y = batch
    model.train()
    with autocast():
        loss = loss_of(model(x).float(), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    opt.zero_grad(set_to_none=True)


def _profiled() -> AbstractContextManager[Any]:
    if _profile_dir is None:
        return nullcontext()
    import gpudoctor

    return gpudoctor.profile(out=_profile_dir / f"p{len(list(_profile_dir.iterdir()))}", interval_s=0.05)


def fresh(ckpt: bool | None = None) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net(ckpt)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


# -- the cases -------------------------------------------------------------------------------------
def plain() -> str:
    model, opt = fresh()
    steps(model, opt)
    return digest(model) + seen(model)


def save_whole_each_epoch() -> str:
    """pytorch/examples word_language_model: evaluate, then ``torch.save(model, f)`` at each epoch end."""
    model, opt = fresh()
    folder = Path(tempfile.mkdtemp(prefix="transparency-"))
    loaded: list[torch.nn.Module] = []

    def epoch_end(e: int) -> None:
        model.eval()
        with torch.no_grad():
            for x, _ in loader(2):
                model(x)
        with open(folder / "model.pt", "wb") as f:
            torch.save(model, f)
        torch.save(model.state_dict(), folder / "state.pt")
        with open(folder / "model.pt", "rb") as f:
            loaded.append(torch.load(f, weights_only=False))
        model.load_state_dict(torch.load(folder / "state.pt"))

    steps(model, opt, epochs=2, at_epoch_end=epoch_end)
    return digest(model, *loaded) + seen(loaded[-1])


def ema_deepcopy_and_averaged() -> str:
    """An EMA by deepcopy (timm's ModelEmaV2) and ``AveragedModel``, both made after the first step."""
    model, opt = fresh()
    made: dict[str, Any] = {}

    def make() -> None:
        made["ema"] = copy.deepcopy(model).eval()
        made["swa"] = torch.optim.swa_utils.AveragedModel(model)

    def update(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if made:
            with torch.no_grad():
                for e, p in zip(made["ema"].parameters(), model.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)
            made["swa"].update_parameters(model)
        return torch.nn.functional.mse_loss(out, y)

    steps(model, opt, after_first=make, loss_of=update)
    pickle.loads(pickle.dumps(made["ema"]))
    return digest(model, made["ema"], made["swa"]) + seen(made["ema"])


def pickle_optimizer() -> str:
    model, opt = fresh()
    copies: list[Any] = []
    steps(model, opt, after_first=lambda: copies.append(pickle.loads(pickle.dumps(opt))))
    buf = io.BytesIO()
    torch.save({"model": model, "optimizer": opt}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    return digest(model, back["model"], extra=(back["optimizer"].state_dict()["param_groups"], len(copies)))


def checkpointing(reentrant: bool) -> Callable[[], str]:
    def run() -> str:
        model, opt = fresh(ckpt=reentrant)
        steps(model, opt)
        return digest(model) + seen(model)

    return run


def custom_function() -> str:
    model, opt = fresh()
    steps(model, opt, loss_of=lambda out, y: Square.apply(out - y).mean())
    return digest(model)


def amp_grad_scaler() -> str:
    model, opt = fresh()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    steps(model, opt, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16), scaler=scaler)
    return digest(model, extra=scaler.state_dict())


def compiled() -> str:
    model, opt = fresh()
    fast = torch.compile(model)
    steps(fast, opt)  # type: ignore[arg-type]
    with torch.no_grad():
        fast.eval()
        out = fast(torch.ones(2, 12))
    return digest(model, extra=out.tolist()) + seen(model)


def scripted_and_exported() -> str:
    """``torch.jit.script`` and ``torch.export`` of a model after its first steps."""
    model, opt = fresh()
    steps(model, opt)
    model.eval()
    x = torch.ones(2, 12)
    scripted = torch.jit.script(model)
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        outs = [scripted(x), exported.module()(x), model(x)]
    assert all(torch.equal(o, outs[-1]) for o in outs)
    return digest(model, extra=outs[-1].tolist())


CASES: dict[str, Callable[[], str]] = {
    "plain": plain, "save_whole_each_epoch": save_whole_each_epoch, "ema": ema_deepcopy_and_averaged,
    "pickle_optimizer": pickle_optimizer, "checkpointing": checkpointing(False),
    "checkpointing_reentrant": checkpointing(True), "custom_function": custom_function,
    "amp_grad_scaler": amp_grad_scaler, "compile": compiled, "script_export": scripted_and_exported,
}


def main() -> None:
    global _profile_dir
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    _profile_dir = args.profile
    if _profile_dir is not None:
        _profile_dir.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    run_forked(CASES, args.cases, args.out)


if __name__ == "__main__":
    main()
