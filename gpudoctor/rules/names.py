"""Fix config keys in the names of the user's own library.

When the run used a Hugging Face Trainer, the recorded ``TrainingArguments``
dict has the installed version's field names, so a key we suggest is checked
against exactly what the user has (``group_by_length`` became
``train_sampling_strategy`` in transformers 5). Plain loops get
``torch.utils.data.DataLoader`` argument names, checked against the signature
recorded in the process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis.process import ProcessView
from gpudoctor.core.events import LoaderEvent


@dataclass
class Names:
    kind: str  # "trainer" | "dataloader"
    library: str
    trainer_fields: set[str]
    loader_params: set[str]
    args: dict[str, Any]
    loader: Mapping[str, Any] | None  # its ``loader`` event
    # Lightning's ModelCheckpoint as built (``lightning_checkpoint`` event), when the run had one.
    lightning: Mapping[str, Any] | None = None
    accelerate: bool = False  # the run saved with ``Accelerator.save_state``
    # Lightning's Trainer settings (its ``plan`` event: val_check_interval, limit_val_batches, precision)
    lightning_trainer: Mapping[str, Any] | None = None
    # Accelerate's Accelerator as built (``accelerator`` event): mixed_precision, accumulation, params
    accelerator: Mapping[str, Any] | None = None

    @property
    def framework(self) -> str:
        """Whose terms a fix speaks: ``trainer``, ``lightning``, ``accelerate`` or ``loop``."""
        if self.is_trainer:
            return "trainer"
        if self.lightning is not None or self.lightning_trainer is not None:
            return "lightning"
        return "accelerate" if self.accelerate or self.accelerator is not None else "loop"

    @property
    def is_trainer(self) -> bool:
        return self.kind == "trainer"

    @property
    def call(self) -> str:
        """How the call whose arguments the fix names is spelled in the user's code."""
        return "TrainingArguments" if self.is_trainer else "DataLoader"

    def items_carry_lengths(self) -> bool:
        """Can the Trainer's ``LengthGroupedSampler`` size the training items? Only when they
        carry ``input_ids`` or the ``length_column_name`` column (it raises otherwise); unknown
        keys (an iterable dataset, an older recording) count as no."""
        keys = (self.loader or {}).get("item_keys")
        if not isinstance(keys, list):
            return False
        return "input_ids" in keys or self.args.get("length_column_name", "length") in keys

    def has(self, trainer_field: str) -> bool:
        return trainer_field in self.trainer_fields

    def loader_key(self, trainer_field: str, loader_arg: str) -> str:
        """The key to use: a TrainingArguments field for Trainer runs (the Trainer builds the
        DataLoader, so a DataLoader argument cannot be passed there), else the DataLoader arg."""
        return trainer_field if self.is_trainer else loader_arg

    def current(self, trainer_field: str, loader_arg: str | None = None) -> Any:
        if self.is_trainer and trainer_field in self.args:
            return self.args[trainer_field]
        if self.loader and loader_arg:
            return self.loader.get(loader_arg)
        return None


def names_for(p: ProcessView | None) -> Names:
    loader = _training_loader(p)
    params = set(loader.get("params") or []) if loader else set()
    if p is not None and p.trainer is not None:
        args = dict(p.trainer.get("args") or {})
        return Names(
            kind="trainer",
            library=f"transformers {p.trainer.get('version')} TrainingArguments",
            trainer_fields=set(args),
            loader_params=params,
            args=args,
            loader=loader,
        )
    torch_version = (p.proc.get("libs") or {}).get("torch") if p is not None else None
    if p is not None and p.torch_cfg:
        torch_version = (p.torch_cfg.get("libs") or {}).get("torch") or torch_version
    label = f"torch {torch_version} DataLoader" if torch_version else "torch.utils.data.DataLoader"
    lightning = p.lightning_checkpoint if p is not None else None
    accelerate = p is not None and "Accelerator.save_state" in p.span_names.get("checkpoint", {})
    plan = p.plan if p is not None and p.plan is not None and p.plan.get("framework") == "lightning" else None
    return Names("dataloader", label, set(), params, {}, loader, lightning, accelerate, plan,
                 p.accelerator if p is not None else None)


def _training_loader(p: ProcessView | None) -> LoaderEvent | None:
    """The loader that fed training: the first one iterated (eval loaders come later)."""
    if p is None or not p.loaders:
        return None
    return min(p.loaders, key=lambda ld: ld.get("t") or 0.0)
