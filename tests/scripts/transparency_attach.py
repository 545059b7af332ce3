"""A word_language_model-like loop for ``gpudoctor attach`` (issue #39): its weights bit-identical
with a doctor attached mid-run and bare.

``python transparency_attach.py OUT --go FILE --step-log LOG``: trains STEPS steps; after step
PAUSE_AT it trains a scratch model until FILE exists (the test attaches first, then creates it), so
the doctor is in for the rest. Each epoch ends with an eval (``model.eval()`` under ``no_grad``), the whole model saved with
``torch.save(model, f)`` and loaded back, and the optimizer pickled; an EMA copy is made by
``copy.deepcopy`` after the first step of the attached part and updated every step. OUT gets the
sha256 of the model's and the EMA's weights.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import pickle
import tempfile
import time
from pathlib import Path

import torch

STEPS, PAUSE_AT, EPOCH = 40, 5, 10


def wait_for(go: Path) -> None:
    """Train a scratch model until ``go`` exists: the doctor sees a training process (it leaves an idle one)
    and the loop's own model, data and random numbers are untouched (no dropout, its own generator)."""
    g = torch.Generator().manual_seed(7)
    scratch = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(scratch.parameters(), lr=0.01)
    while not go.exists():
        scratch(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--go", type=Path, required=True)
    ap.add_argument("--step-log", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(16 * 8, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    folder = Path(tempfile.mkdtemp(prefix="transparency-attach-"))
    ema: torch.nn.Module | None = None
    for step in range(1, STEPS + 1):
        x, y = torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 50, (4,), generator=g)
        model.train()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step > PAUSE_AT:
            if ema is None:
                ema = copy.deepcopy(model)
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)
        if step % EPOCH == 0:
            model.eval()
            with torch.no_grad():
                model(x)
            with open(folder / "model.pt", "wb") as f:
                torch.save(model, f)
            with open(folder / "model.pt", "rb") as f:
                torch.load(f, weights_only=False)
            pickle.loads(pickle.dumps(opt))
        with open(args.step_log, "a") as log:
            log.write(f"{step}\n")
        if step == PAUSE_AT:
            wait_for(args.go)
        time.sleep(0.02)  # the doctor's samplers get their turn; gdb may stop the loop in this sleep
    assert ema is not None
    h = hashlib.sha256()
    for m in (model, ema):
        for t in m.state_dict().values():
            h.update(t.detach().contiguous().numpy().tobytes())
    Path(args.out).write_text(h.hexdigest() + "\n")


if __name__ == "__main__":
    main()
