"""The replay config's sections: typed options objects, one per YAML section.

Their fields are the YAML's keys (``sample_configs/README.md``); :mod:`gpudoctor.replay.config`
loads and :mod:`gpudoctor.replay.checks` validates them, both importing these types, so neither
imports the other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpudoctor.common.errors import UserError
from gpudoctor.replay.schema import one_line

Stage = Literal["ahead", "startup", "getitem", "collate", "loop"]  # in checks.STAGE_ORDER's order


@dataclass
class LengthDist:
    """Length of each synthetic example, in tokens (approximately) or words."""

    mean: float = field(default=200.0, metadata={"gt": 0})
    sigma: float = field(default=0.5, metadata={"ge": 0})
    min: int = field(default=1, metadata={"ge": 1})
    max: int | None = field(default=None, metadata={"ge": 1})
    unit: Literal["tokens", "words"] = "tokens"
    dist: Literal["lognormal", "fixed", "uniform"] = "lognormal"


@dataclass
class DatasetSection:
    kind: Literal["jsonl", "text", "arrow", "disk", "synthetic"] = "synthetic"
    path: str | None = None
    split: str | None = None
    count: int | None = field(default=None, metadata={"ge": 1})
    length: LengthDist = field(default_factory=LengthDist)
    fields: list[str] | None = None
    seed: int = 0


@dataclass
class TextSection:
    template: str | None = None
    field: str = "text"
    format_at: Stage = "ahead"


@dataclass
class BpeSection:
    vocab_size: int = field(default=8000, metadata={"ge": 300})
    train_examples: int = field(default=2000, metadata={"ge": 10})


@dataclass
class TokenizerSection:
    path: str | None = None
    train_bpe: BpeSection | None = None
    tokenize_at: Stage = "getitem"


@dataclass
class ModelSection:
    arch: str = "gpt2"
    config: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    params_b: float | None = field(default=None, metadata={"gt": 0})
    n_layers: int | None = field(default=None, metadata={"ge": 1})
    hidden_size: int | None = field(default=None, metadata={"ge": 1})
    method: Literal["full", "lora"] = "full"
    attention: Literal["quadratic", "none"] = "quadratic"
    lora_fraction: float = field(default=0.01, metadata={"gt": 0, "le": 1})


@dataclass
class TrainingSection:
    """Field names and defaults of ``transformers.TrainingArguments`` (where they exist)."""

    per_device_train_batch_size: int = field(default=8, metadata={"ge": 1})
    gradient_accumulation_steps: int = field(default=1, metadata={"ge": 1})
    dataloader_num_workers: int = field(default=0, metadata={"ge": 0})
    dataloader_pin_memory: bool = True
    dataloader_prefetch_factor: int | None = field(default=None, metadata={"ge": 1})
    dataloader_persistent_workers: bool = False
    dataloader_drop_last: bool = False
    save_steps: int | None = field(default=None, metadata={"ge": 1})
    bf16: bool = False
    fp16: bool = False
    tf32: bool | None = None
    num_train_epochs: float = field(default=1.0, metadata={"gt": 0})
    max_steps: int = -1
    learning_rate: float = field(default=5e-5, metadata={"gt": 0})
    weight_decay: float = field(default=0.0, metadata={"ge": 0})
    warmup_steps: int = field(default=0, metadata={"ge": 0})
    max_grad_norm: float = field(default=1.0, metadata={"ge": 0})
    seed: int = 42
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    optim: str = "adamw_torch"
    logging_steps: int = field(default=10, metadata={"ge": 1})


@dataclass
class GpuSpecSection:
    """Override or define the target GPU's figures (dense, no sparsity)."""

    name: str | None = None
    bf16_tflops: float | None = field(default=None, metadata={"gt": 0})
    fp16_tflops: float | None = field(default=None, metadata={"gt": 0})
    tf32_tflops: float | None = field(default=None, metadata={"gt": 0})
    fp32_tflops: float | None = field(default=None, metadata={"gt": 0})
    memory_gb: float | None = field(default=None, metadata={"gt": 0})
    bandwidth_gb_s: float | None = field(default=None, metadata={"gt": 0})


@dataclass
class HardwareSection:
    target: str | None = None
    gpus: int = field(default=1, metadata={"ge": 1})
    price_per_gpu_hour: float | None = field(default=None, metadata={"ge": 0})
    cpu_cores: int | None = field(default=None, metadata={"ge": 1})
    mfu: float = field(default=0.4, metadata={"gt": 0, "le": 1})
    checkpoint_write_gb_s: float = field(default=1.0, metadata={"gt": 0})
    cpu_speed_factor: float = field(default=1.0, metadata={"gt": 0})
    gpu_spec: GpuSpecSection | None = None


@dataclass
class FullRunSection:
    examples: int | None = field(default=None, metadata={"ge": 1})
    max_length: int | None = field(default=None, metadata={"ge": 1})
    epochs: float | None = field(default=None, metadata={"gt": 0})
    max_steps: int | None = field(default=None, metadata={"ge": 1})


@dataclass
class ReplaySection:
    steps: int = field(default=20, metadata={"ge": 1})
    seconds: float = field(default=30.0, metadata={"gt": 0})
    examples: int = field(default=2000, metadata={"ge": 1})
    save_steps: int | None = field(default=None, metadata={"ge": 1})
    measure_batches: int = field(default=20, metadata={"ge": 1})
    measure_seconds: float = field(default=3.0, metadata={"gt": 0})
    read_latency_ms: float = field(default=0.0, metadata={"ge": 0})
    device: Literal["auto", "cpu", "cuda"] = "auto"


@dataclass
class ReplayConfig:
    """Everything one replay needs; ``lines`` maps dotted keys to their YAML line."""

    dataset: DatasetSection = field(default_factory=DatasetSection)
    text: TextSection = field(default_factory=TextSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    max_length: int = field(default=512, metadata={"ge": 8})
    padding: Literal["max_length", "longest", "packing"] = "longest"
    loop: Literal["plain", "trainer"] = "plain"
    model: ModelSection = field(default_factory=ModelSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    hardware: HardwareSection = field(default_factory=HardwareSection)
    full_run: FullRunSection = field(default_factory=FullRunSection)
    replay: ReplaySection = field(default_factory=ReplaySection)
    source: str = field(default="<config>", init=False)
    base_dir: str = field(default=".", init=False)
    lines: dict[str, int] = field(default_factory=dict, init=False)

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
