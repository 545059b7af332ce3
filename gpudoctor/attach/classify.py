"""Which breakdown category one stack sample belongs to.

The markers are the functions the in-process hooks wrap, so a sampled
breakdown and a hooked one mean the same thing: data wait is time under
``DataLoader.__next__`` (tokenizing there counts as data wait, and also as
tokenization), checkpoint is ``torch.save`` / ``save_pretrained`` /
safetensors / Trainer checkpoints, eval is ``Trainer.evaluate`` or Lightning's
evaluation loop, or, in a hand-written loop, a function of the script named like
an eval (``estimate_loss``, ``evaluate``, ``validate``, ``run_val``...) with no
backward or optimizer step under it (what the hooks call an eval region: forward
passes without backward), format is ``datasets`` map/filter/load. Priority
follows the analysis: eval, then checkpoint, then data wait.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpudoctor.analysis.sampled import Code

Frame = tuple[str, str]  # (function name, file name), root first

_EVAL = (
    ("transformers/trainer.py", ("Trainer.evaluate", "Trainer.evaluation_loop", "Trainer.prediction_loop")),
    ("loops/evaluation_loop.py", ("",)),
)
_CHECKPOINT = (
    ("torch/serialization.py", ("save", "_save", "_legacy_save")),
    ("safetensors/torch.py", ("save_file", "save_model", "save")),
    ("transformers/trainer.py", ("Trainer._save_checkpoint", "Trainer.save_model", "Trainer._save")),
    ("accelerate/accelerator.py", ("Accelerator.save_state",)),
    ("", (".save_pretrained", ".save_checkpoint")),
)
_DATA_WAIT = (("torch/utils/data/dataloader.py", ("__next__",)),)
_TOKENIZE = (("transformers/tokenization_utils", ("",)), ("/tokenizers/", ("",)))
_FORMAT = (
    ("datasets/arrow_dataset.py", ("map", "filter", "_map_single")),
    ("datasets/dataset_dict.py", ("map", "filter")),
    ("datasets/load.py", ("load_dataset", "load_from_disk")),
)
_MODEL_LOAD = (("", (".from_pretrained",)),)
_COMPUTE = (
    ("torch/nn/modules/module.py", ("_call_impl",)),
    ("torch/autograd/", ("",)),
    ("torch/_tensor.py", ("backward",)),
    ("torch/optim/", ("",)),
    ("torch/nn/parallel/distributed.py", ("",)),
    ("transformers/trainer.py", ("Trainer.training_step", "Trainer.compute_loss")),
)
_TRAINS = (("torch/_tensor.py", ("backward",)), ("torch/autograd/", ("backward", "grad")), ("torch/optim/", ("",)))
_EVAL_WORDS = frozenset({"eval", "evals", "evaluate", "evaluation", "validate", "validation", "val", "valid"})
_WORDS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_LIBRARY = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen")
_WORKER_LOOP = (("torch/utils/data/_utils/worker.py", ("_worker_loop",)),)
_WORKER_FETCH = (("torch/utils/data/_utils/fetch.py", ("",)),)


def _matches(frames: Sequence[Frame], markers: tuple[tuple[str, tuple[str, ...]], ...]) -> bool:
    for name, filename in frames:
        if name == "<module>":  # a module body runs on import, not as the marker function
            continue
        path = filename.replace("\\", "/")
        for file_part, name_parts in markers:
            if file_part in path and any(_name_matches(name, part) for part in name_parts):
                return True
    return False


def _name_matches(name: str, part: str) -> bool:
    if not part:
        return True
    if part.startswith("."):  # a method of any class
        return name.endswith(part) or name == part[1:]
    return name == part or name.endswith("." + part)


def _eval_named(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "estimate_loss" in last or not _EVAL_WORDS.isdisjoint(w.lower() for w in _WORDS.split(last))


def _hand_written_eval(frames: Sequence[Frame]) -> bool:
    """A script's own eval-named function on the stack, with no backward or optimizer under it."""
    for i, (name, filename) in enumerate(frames):
        path = filename.replace("\\", "/")
        if name != "<module>" and not any(part in path for part in _LIBRARY) and _eval_named(name):
            return not _matches(frames[i + 1:], _TRAINS)
    return False


def classify(frames: Sequence[Frame]) -> str:
    """One :class:`Code` letter for the main thread of a training process."""
    if _matches(frames, _WORKER_LOOP):
        return Code.WORKER_FETCH if _matches(frames, _WORKER_FETCH) else Code.WORKER_IDLE
    tokenizing = _matches(frames, _TOKENIZE)
    if _matches(frames, _EVAL) or _hand_written_eval(frames):
        return Code.EVAL
    if _matches(frames, _CHECKPOINT):
        return Code.CHECKPOINT
    if _matches(frames, _DATA_WAIT):
        return Code.DATA_WAIT_TOKENIZE if tokenizing else Code.DATA_WAIT
    if _matches(frames, _FORMAT):
        return Code.FORMAT
    if _matches(frames, _MODEL_LOAD):
        return Code.MODEL_LOAD
    if tokenizing:
        return Code.TOKENIZE
    if any("importlib._bootstrap" in filename for _, filename in frames):
        return Code.OTHER  # importing torch walks through torch/autograd: not a training step
    if _matches(frames, _COMPUTE):
        return Code.COMPUTE
    return Code.OTHER
