"""The replay config's sections: typed options objects, one per YAML section, validated by pydantic.

Their fields are the YAML's keys (``sample_configs/README.md``); a field's type says what it
takes and its bounds (``Annotated`` with :mod:`annotated_types`, which pydantic reads). Each is a
frozen pydantic dataclass: a config refuses an unknown key (``extra="forbid"``) and is not
changed once loaded, and ``dataclasses.fields``/``asdict``/``replace`` work on it as on any
dataclass. :mod:`gpudoctor.replay.schema` turns pydantic's first error into one line;
:mod:`gpudoctor.replay.config` loads and :mod:`gpudoctor.replay.checks` checks across fields,
both importing these types, so neither imports the other.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import Ge, Gt, Le
from pydantic import BeforeValidator, ConfigDict, Strict
from pydantic.dataclasses import dataclass

from gpudoctor.common.errors import UserError
from gpudoctor.replay.schema import one_line

Stage = Literal["ahead", "startup", "getitem", "collate", "loop"]  # in checks.STAGE_ORDER's order

# What YAML gives is taken as it is (strict): "3" is not a count, 1 is not true, 7 is not text.
# Two readings are kept on purpose: 2.0 is the whole number 2, and "1e-4" (YAML 1.1 reads an
# exponent without a dot as text) is the number 0.0001. NaN and infinity are refused.
CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    return value


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _empty_is_default(value: Any) -> Any:
    return {} if value is None else value  # `training:` with nothing under it: the defaults


Number = Annotated[float, Strict(), BeforeValidator(_number)]
Whole = Annotated[int, Strict(), BeforeValidator(_whole)]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]
Positive = Annotated[Number, Gt(0)]
NonNegative = Annotated[Number, Ge(0)]
Share = Annotated[Number, Gt(0), Le(1)]
Count = Annotated[Whole, Ge(1)]
S = TypeVar("S")
Section = Annotated[S, BeforeValidator(_empty_is_default)]


@dataclass(frozen=True, config=CONFIG)
class LengthDist:
    """Length of each synthetic example, in tokens (approximately) or words."""

    mean: Positive = 200.0
    sigma: NonNegative = 0.5
    min: Count = 1
    max: Count | None = None
    unit: Literal["tokens", "words"] = "tokens"
    dist: Literal["lognormal", "fixed", "uniform"] = "lognormal"


@dataclass(frozen=True, config=CONFIG)
class DatasetSection:
    kind: Literal["jsonl", "text", "arrow", "disk", "synthetic"] = "synthetic"
    path: Text | None = None
    split: Text | None = None
    count: Count | None = None
    length: Section[LengthDist] = field(default_factory=LengthDist)
    fields: list[Text] | None = None
    seed: Whole = 0


@dataclass(frozen=True, config=CONFIG)
class TextSection:
    template: Text | None = None
    field: Text = "text"
    format_at: Stage = "ahead"


@dataclass(frozen=True, config=CONFIG)
class BpeSection:
    vocab_size: Annotated[Whole, Ge(300)] = 8000
    train_examples: Annotated[Whole, Ge(10)] = 2000


@dataclass(frozen=True, config=CONFIG)
class TokenizerSection:
    path: Text | None = None
    train_bpe: BpeSection | None = None
    tokenize_at: Stage = "getitem"


@dataclass(frozen=True, config=CONFIG)
class ModelSection:
    arch: Text = "gpt2"
    config: dict[Text, Any] = field(default_factory=dict)
    path: Text | None = None
    params_b: Positive | None = None
    n_layers: Count | None = None
    hidden_size: Count | None = None
    method: Literal["full", "lora"] = "full"
    attention: Literal["quadratic", "none"] = "quadratic"
    lora_fraction: Share = 0.01


@dataclass(frozen=True, config=CONFIG)
class TrainingSection:
    """Field names and defaults of ``transformers.TrainingArguments`` (where they exist)."""

    per_device_train_batch_size: Count = 8
    gradient_accumulation_steps: Count = 1
    dataloader_num_workers: Annotated[Whole, Ge(0)] = 0
    dataloader_pin_memory: Flag = True
    dataloader_prefetch_factor: Count | None = None
    dataloader_persistent_workers: Flag = False
    dataloader_drop_last: Flag = False
    save_steps: Count | None = None
    bf16: Flag = False
    fp16: Flag = False
    tf32: Flag | None = None
    num_train_epochs: Positive = 1.0
    max_steps: Whole = -1
    learning_rate: Positive = 5e-5
    weight_decay: NonNegative = 0.0
    warmup_steps: Annotated[Whole, Ge(0)] = 0
    max_grad_norm: NonNegative = 1.0
    seed: Whole = 42
    gradient_checkpointing: Flag = False
    torch_compile: Flag = False
    optim: Text = "adamw_torch"
    logging_steps: Count = 10


@dataclass(frozen=True, config=CONFIG)
class GpuSpecSection:
    """Override or define the target GPU's figures (dense, no sparsity)."""

    name: Text | None = None
    bf16_tflops: Positive | None = None
    fp16_tflops: Positive | None = None
    tf32_tflops: Positive | None = None
    fp32_tflops: Positive | None = None
    memory_gb: Positive | None = None
    bandwidth_gb_s: Positive | None = None


@dataclass(frozen=True, config=CONFIG)
class HardwareSection:
    target: Text | None = None
    gpus: Count = 1
    price_per_gpu_hour: NonNegative | None = None
    cpu_cores: Count | None = None
    mfu: Share = 0.4
    checkpoint_write_gb_s: Positive = 1.0
    cpu_speed_factor: Positive = 1.0
    gpu_spec: GpuSpecSection | None = None


@dataclass(frozen=True, config=CONFIG)
class FullRunSection:
    examples: Count | None = None
    max_length: Count | None = None
    epochs: Positive | None = None
    max_steps: Count | None = None


@dataclass(frozen=True, config=CONFIG)
class ReplaySection:
    steps: Count = 20
    seconds: Positive = 30.0
    examples: Count = 2000
    save_steps: Count | None = None
    measure_batches: Count = 20
    measure_seconds: Positive = 3.0
    read_latency_ms: NonNegative = 0.0
    device: Literal["auto", "cpu", "cuda"] = "auto"


@dataclass(frozen=True, config=CONFIG)
class ReplayConfig:
    """Everything one replay needs; ``lines`` maps dotted keys to their YAML line.

    ``source``, ``base_dir`` and ``lines`` say where the config was read from: no YAML key
    sets them (they are not ``__init__`` arguments), :meth:`placed` does, once, as it loads.
    """

    dataset: Section[DatasetSection] = field(default_factory=DatasetSection)
    text: Section[TextSection] = field(default_factory=TextSection)
    tokenizer: Section[TokenizerSection] = field(default_factory=TokenizerSection)
    max_length: Annotated[Whole, Ge(8)] = 512
    padding: Literal["max_length", "longest", "packing"] = "longest"
    loop: Literal["plain", "trainer"] = "plain"
    model: Section[ModelSection] = field(default_factory=ModelSection)
    training: Section[TrainingSection] = field(default_factory=TrainingSection)
    hardware: Section[HardwareSection] = field(default_factory=HardwareSection)
    full_run: Section[FullRunSection] = field(default_factory=FullRunSection)
    replay: Section[ReplaySection] = field(default_factory=ReplaySection)
    source: str = field(default="<config>", init=False)
    base_dir: str = field(default=".", init=False)
    lines: dict[str, int] = field(default_factory=dict, init=False)

    def placed(self, source: str, base_dir: str, lines: dict[str, int]) -> ReplayConfig:
        """This config, told the file it was read from (the loader's one write to it)."""
        for name, value in (("source", source), ("base_dir", base_dir), ("lines", lines)):
            object.__setattr__(self, name, value)  # frozen for everyone after the loader
        return self

    def line_of(self, dotted: str) -> int | None:
        """The YAML line of ``dotted`` or of its nearest parent that was written."""
        parts = dotted.split(".")
        while parts:
            line = self.lines.get(".".join(parts))
            if line:
                return line
            parts.pop()
        return None

    def error(self, dotted: str, message: str) -> UserError:
        line = self.line_of(dotted)
        at = f"{self.source}:{line}" if line else self.source
        return UserError(one_line(f"{at}: {dotted}: {message}"))

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def sha256(self) -> str:
        """Stable digest of what the replay builds (not of where the file lives)."""
        import hashlib
        import json

        body = dataclasses.asdict(self)
        for key in ("source", "base_dir", "lines"):
            body.pop(key, None)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


SECTION_TYPES: dict[str, type] = {
    "dataset": DatasetSection,
    "text": TextSection,
    "tokenizer": TokenizerSection,
    "model": ModelSection,
    "training": TrainingSection,
    "hardware": HardwareSection,
    "full_run": FullRunSection,
    "replay": ReplaySection,
}
