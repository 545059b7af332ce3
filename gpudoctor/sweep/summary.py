"""The winner as something to paste: a YAML diff of the config, ``TrainingArguments``
keyword arguments and command-line flags, and learning-rate advice when the
effective batch moved.
"""

from __future__ import annotations

import math
from typing import Any

import yaml


def change(baseline: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """What differs between the user's current setting and ``params``."""
    moved = {k: (baseline.get(k), v) for k, v in params.items() if baseline.get(k) != v}
    training = {
        k.split(".", 1)[1]: new for k, (_, new) in moved.items() if k.startswith("training.")
    }
    return {
        "params": {k: {"from": old, "to": new} for k, (old, new) in moved.items()},
        "yaml_diff": yaml_diff(moved),
        "training_arguments": training,
        "cli_args": " ".join(f"--{k} {_flag(v)}" for k, v in training.items()),
        "python": "TrainingArguments(..., "
        + ", ".join(f"{k}={v!r}" for k, v in training.items())
        + ")"
        if training
        else None,
        "command": None,
    }


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _scalar(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True)  # yaml has no type information here
    return text.removesuffix("\n...\n").strip()


def yaml_diff(moved: dict[str, tuple[Any, Any]]) -> str:
    """A unified-diff-style snippet of the changed keys under their sections."""
    lines: list[str] = []
    parents_done: list[str] = []
    for dotted in sorted(moved, key=lambda k: k.split(".")):
        old, new = moved[dotted]
        *parents, leaf = dotted.split(".")
        for depth, name in enumerate(parents):
            path = ".".join(parents[: depth + 1])
            if path not in parents_done:
                parents_done.append(path)
                lines.append(" " + "  " * depth + f"{name}:")
        pad = "  " * len(parents)
        lines.append("-" + pad + f"{leaf}: {_scalar(old)}")
        lines.append("+" + pad + f"{leaf}: {_scalar(new)}")
    return "\n".join(lines)


def lr_advice(grid: dict[str, Any], new_batch: int) -> dict[str, Any] | None:
    """Learning rates for a changed effective batch, by the linear and square-root rules."""
    old, lr = grid.get("global_batch"), grid.get("learning_rate")
    if not old or lr is None or new_batch == old:
        return None
    ratio = new_batch / old
    return {
        "effective_batch_from": old,
        "effective_batch_to": new_batch,
        "learning_rate": lr,
        "linear": lr * ratio,
        "sqrt": lr * math.sqrt(ratio),
        "text": f"the effective batch changes {old} -> {new_batch} (x{ratio:g}): scale learning_rate {lr:g} "
        f"to {lr * ratio:.3g} by the linear rule (Goyal et al. 2017, SGD-like) or to "
        f"{lr * math.sqrt(ratio):.3g} by the square-root rule (common for Adam), and keep the warmup",
    }
