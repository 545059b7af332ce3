"""The input pipeline a config describes: formatting, tokenizing and padding, each
done at the stage the config names (ahead, startup, getitem, collate or loop).

Objects here are picklable so DataLoader workers can run them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from gpudoctor.common.errors import UserError

Row = dict[str, Any]


@dataclass(frozen=True)
class Stages:
    """Where formatting (``fmt``) and tokenization (``tok``) happen."""

    fmt: str
    tok: str


class TextOps:
    """Format a record, tokenize texts, pad or check token id lists into a batch."""

    def __init__(
        self,
        template: str | None,
        field: str,
        tokenizer: Any,
        max_length: int,
        padding: str,
        causal: bool,
    ) -> None:
        self.template = template
        self.field = field
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.padding = padding
        self.causal = causal
        self.pad_id = int(tokenizer.pad_token_id)

    def format(self, row: Row) -> str:
        try:
            if self.template:
                return self.template.format_map(row)
            return str(row[self.field])
        except KeyError as exc:
            raise UserError(
                f"a dataset row has no field {exc.args[0]!r} (the row has: {', '.join(map(str, row))}); "
                "fix text.template or text.field"
            ) from None

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Truncate to ``max_length`` as the training script would."""
        if len(texts) == 1:
            return [
                self.tokenizer(texts[0], truncation=True, max_length=self.max_length)["input_ids"]
            ]
        ids: list[list[int]] = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        return ids

    def pad(self, ids: list[list[int]]) -> dict[str, torch.Tensor]:
        width = self.max_length if self.padding == "max_length" else max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            n = min(len(row), width)
            input_ids[i, :n] = torch.tensor(row[:n], dtype=torch.long)
            mask[i, :n] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def apply_stage(ops: TextOps, stages: Stages, stage: str, rows: list[Row]) -> list[Row]:
    """Do the work the config places at ``stage`` on ``rows``."""
    if stages.fmt == stage:
        rows = [{"text": ops.format(r)} for r in rows]
    if stages.tok == stage:
        rows = [{"input_ids": ids} for ids in ops.tokenize([r["text"] for r in rows])]
    return rows


class ReplayDataset(Dataset[Row]):
    """Map-style dataset over the prepared Arrow data; ``getitem`` stages run here.

    ``read_latency_s`` sleeps per example, standing in for slow storage (network
    filesystems, object stores) that DataLoader workers can hide.
    """

    def __init__(
        self, data: Any, ops: TextOps, stages: Stages, read_latency_s: float = 0.0
    ) -> None:
        self.data = data
        self.ops = ops
        self.stages = stages
        self.read_latency_s = read_latency_s

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Row:
        if self.read_latency_s:
            time.sleep(self.read_latency_s)
        return apply_stage(self.ops, self.stages, "getitem", [self.data[index]])[0]


class Collator:
    """``collate_fn``: the ``collate`` stages, then padding (unless the loop still has work)."""

    def __init__(self, ops: TextOps, stages: Stages) -> None:
        self.ops = ops
        self.stages = stages

    def __call__(self, rows: list[Row]) -> Any:
        rows = apply_stage(self.ops, self.stages, "collate", rows)
        if self.stages.tok == "loop":
            return rows
        return self.ops.pad([r["input_ids"] for r in rows])


class LoopWork:
    """What the training loop itself does to each batch before the forward pass."""

    def __init__(self, ops: TextOps, stages: Stages) -> None:
        self.ops = ops
        self.stages = stages

    def __call__(self, rows: list[Row]) -> dict[str, torch.Tensor]:
        rows = apply_stage(self.ops, self.stages, "loop", rows)
        return self.ops.pad([r["input_ids"] for r in rows])


def pack(ids: list[list[int]], length: int, eos_id: int) -> list[list[int]]:
    """Concatenate examples (each followed by EOS) and cut into ``length`` chunks; drop the tail."""
    stream: list[int] = []
    for row in ids:
        stream.extend(row)
        stream.append(eos_id)
    return [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]
