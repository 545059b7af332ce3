"""A fix in the terms of the framework the run used: Trainer, Lightning, Accelerate or a plain loop.

Rules compute figures (how often to save, whether to drop optimizer state); this module says
which call of the user's own framework takes them, with which argument names, checked against
what the installed version recorded (``TrainingArguments`` fields, ``ModelCheckpoint``'s
parameters). A name the installed version lacks is never prescribed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from gpudoctor.rules.base import LOOP_LIBRARY, Table
from gpudoctor.rules.names import Names


@dataclass
class SaveFix:
    """How to save less often (and lighter), as the user's framework spells it."""

    library: str
    call: str | None  # None: the script's own loop
    config: dict[str, Any] = field(default_factory=dict)
    snippet: str = ""
    lighter: str = ""  # the words for dropping optimizer state, "" when not prescribed


def lightning_version(names: Names) -> str | None:
    version = (names.lightning or {}).get("version") or (names.lightning_trainer or {}).get("version")
    return str(version) if version else None


@dataclass
class EvalFix:
    """How to evaluate less often (or on fewer batches), as the user's framework spells it."""

    library: str
    call: str | None
    config: dict[str, Any]
    snippet: str
    interval_key: str  # the argument that sets the interval, in the summary's words
    batches_key: str


def eval_fix(names: Names, new_interval: int, old_interval: int) -> EvalFix:
    """Evaluate every ``new_interval`` steps: Lightning's ``Trainer(val_check_interval=…)``
    (``limit_val_batches`` for fewer batches), else the loop's own ``eval_interval``."""
    if names.framework == "lightning" and "val_check_interval" in (names.lightning_trainer or {}):
        version = lightning_version(names)
        return EvalFix(f"lightning {version} Trainer" if version else "lightning Trainer", "Trainer",
                       {"val_check_interval": new_interval},
                       f"Trainer(..., val_check_interval={new_interval})  # was {old_interval}",
                       "val_check_interval", "limit_val_batches")
    return EvalFix(LOOP_LIBRARY, None, {"eval_interval": new_interval},
                   f"if step % {new_interval} == 0:  # was {old_interval}\n    evaluate()",
                   "eval_interval", "eval_batches")


def save_fix(names: Names, every_steps: int | None) -> SaveFix:
    """Save every ``every_steps`` steps (and without optimizer state where the framework can)."""
    framework = names.framework
    if framework == "trainer":
        return _trainer(names, every_steps)
    if framework == "lightning":
        return _lightning(names, every_steps)
    if framework == "accelerate":
        version = accelerate_version(names)
        return SaveFix(f"accelerate {version} Accelerator.save_state" if version else "accelerate Accelerator.save_state",
                       None, {"save_steps": every_steps},
                       f"if step % {every_steps} == 0:\n    accelerator.save_state(output_dir)")
    return SaveFix(LOOP_LIBRARY, None, {"save_steps": every_steps},
                   f"if step % {every_steps} == 0:\n    torch.save(state, path)")


def _trainer(names: Names, every_steps: int | None) -> SaveFix:
    config: dict[str, Any] = {"save_steps": every_steps}
    lighter = ""
    if names.has("save_only_model") and not names.current("save_only_model"):
        config["save_only_model"] = True
        lighter = "skip optimizer state in intermediate saves"
    args = ", ".join(f"{k}={v!r}" for k, v in config.items())
    return SaveFix(names.library, names.call, config, f"TrainingArguments(..., {args})", lighter)


def _lightning(names: Names, every_steps: int | None) -> SaveFix:
    event = names.lightning or {}
    params = set(event.get("params") or [])
    current = event.get("args") or {}
    config: dict[str, Any] = {}
    if "every_n_train_steps" in params:
        config["every_n_train_steps"] = every_steps
    lighter = ""
    if "save_weights_only" in params and not current.get("save_weights_only"):
        config["save_weights_only"] = True
        lighter = "save weights only (no optimizer state)"
    if "save_top_k" in params and current.get("save_top_k") == -1:
        config["save_top_k"] = 1  # every save kept: disk and delete time grow with the run
    version = lightning_version(names)
    library = f"lightning {version} ModelCheckpoint" if version else "lightning ModelCheckpoint"
    args = ", ".join(f"{k}={v!r}" for k, v in config.items())
    return SaveFix(library, "ModelCheckpoint", config,
                   f"ModelCheckpoint(..., {args})  # in Trainer(callbacks=[...])", lighter)


def current_save_steps(names: Names) -> Any:
    """The save interval the run was set to, in steps, as its framework records it."""
    if names.framework == "lightning":
        return ((names.lightning or {}).get("args") or {}).get("every_n_train_steps")
    return names.current("save_steps")


@dataclass
class CallFix:
    """One call's arguments, as the user's framework spells them; ``also`` for a second call."""

    library: str | None
    call: str | None
    config: dict[str, Any]
    snippet: str
    also: list[Table] = field(default_factory=list)


def accelerate_version(names: Names) -> str | None:
    version = (names.accelerator or {}).get("version")
    return str(version) if version else None


def _accelerator_label(names: Names) -> str:
    version = accelerate_version(names)
    return f"accelerate {version} Accelerator" if version else "accelerate Accelerator"


def _accelerator_takes(names: Names, arg: str) -> bool:
    return arg in set((names.accelerator or {}).get("params") or [])


def mixed_precision_fix(names: Names) -> CallFix:
    """Train in bf16: ``Trainer(precision="bf16-mixed")`` (Lightning 1.x: ``"bf16"``),
    ``Accelerator(mixed_precision="bf16")``, ``TrainingArguments(bf16=True)``, else autocast."""
    plan = names.lightning_trainer or {}
    if names.framework == "lightning" and "precision" in plan:
        version = lightning_version(names)
        value = "bf16" if (version or "").startswith("1.") else "bf16-mixed"  # the 2.x spelling
        return CallFix(f"lightning {version} Trainer" if version else "lightning Trainer", "Trainer",
                       {"precision": value}, f"Trainer(..., precision={value!r})  # was {plan.get('precision')!r}")
    if names.framework == "accelerate" and _accelerator_takes(names, "mixed_precision"):
        was = (names.accelerator or {}).get("mixed_precision")
        return CallFix(_accelerator_label(names), "Accelerator", {"mixed_precision": "bf16"},
                       f"accelerator = Accelerator(..., mixed_precision='bf16')  # was {was!r}\n"
                       "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)")
    return CallFix(names.library, names.call, {"bf16": True} if names.has("bf16") else {},
                   "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(**batch).loss")


def batch_fix(names: Names, config: dict[str, Any]) -> CallFix:
    """A larger per-device batch (and less accumulation): for Accelerate, accumulation is the
    ``Accelerator``'s argument and the batch the ``DataLoader``'s, one table each."""
    accum = config.get("gradient_accumulation_steps")
    if names.framework == "accelerate" and accum is not None and _accelerator_takes(names, "gradient_accumulation_steps"):
        loader = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
        return CallFix(names.library, names.call, loader,
                       f"accelerator = Accelerator(..., gradient_accumulation_steps={accum})",
                       [Table(_accelerator_label(names), "Accelerator", {"gradient_accumulation_steps": accum})])
    return CallFix(names.library, names.call, config, "")


def current_accumulation(names: Names) -> Any:
    """The run's gradient accumulation, as its framework recorded it (None: not recorded)."""
    if names.framework == "accelerate":
        return (names.accelerator or {}).get("gradient_accumulation_steps")
    return names.current("gradient_accumulation_steps")


# Packages whose presence in a loader's items says the per-example work is image decoding and
# augmentation, not text: a tokenizer call in the process says text whatever else is loaded.
IMAGE_LIBS = frozenset({"torchvision", "PIL", "albumentations", "kornia", "timm", "cv2"})


def is_image_pipeline(names: Names, tokenize_calls: int) -> bool:
    """The training loader's items are made with an image library (its transforms, its values)
    and the process made no tokenizer call."""
    libs = set((names.loader or {}).get("item_libs") or [])
    return tokenize_calls == 0 and bool(libs & IMAGE_LIBS)


class FixWords(TypedDict):
    """A ``Fix``'s ``summary`` and ``snippet``, passed as ``Fix(**words, …)``."""

    summary: str
    snippet: str


def cpu_work_words(names: Names, tokenize_calls: int, cores: int, workers: int) -> FixWords:
    """``Fix`` ``summary`` and ``snippet`` for per-example CPU work when every core is busy:
    for text, tokenize once with ``datasets.map``; for images, decode and resize once into a
    cache of small images and augment on the GPU (torchvision.transforms.v2 on the device, DALI)."""
    if is_image_pipeline(names, tokenize_calls):
        return {
            "summary": "Decode and resize the images once offline into a cache of small images, and move "
            "augmentation to the GPU (torchvision.transforms.v2 on the device, or NVIDIA DALI); keep workers "
            "at most the free cores, or rent a machine with more CPU per GPU.",
            "snippet": (
                "# once, offline: decode and resize to the training size (a cache of small images)\n"
                "for src in image_paths:\n"
                "    Image.open(src).convert('RGB').resize((256, 256)).save(cache_dir / (src.stem + '.jpg'), quality=90)\n"
                "# per item on the CPU: read the small image only (no augmentation here)\n"
                f"loader = DataLoader(cached_ds, batch_size=batch_size, num_workers={workers}, pin_memory=True)\n"
                "augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])\n"
                "for images, labels in loader:\n"
                "    images = augment(images.to('cuda', non_blocking=True))  # augmentation on the GPU\n"
                "# or NVIDIA DALI: fn.decoders.image(..., device='mixed') decodes on the GPU"
            ),
        }
    return {
        "summary": "Do the per-example work (tokenizing, formatting, decoding) once offline and load the "
        "result; keep workers at most the free cores, or rent a machine with more CPU per GPU.",
        "snippet": f"ds = ds.map(preprocess, batched=True, num_proc={max(1, cores)})\nds.save_to_disk('data/ready')",
    }


# -- data parallelism (DDP) -------------------------------------------------------------------
def no_sync_fix(names: Names, accum: int) -> CallFix:
    """All-reduce once per optimizer step: ``accelerator.accumulate(model)`` under Accelerate,
    else ``model.no_sync()`` on every micro-step but the last (the Trainer and Lightning do it)."""
    if names.framework == "accelerate":
        call = {"gradient_accumulation_steps": accum} if _accelerator_takes(names, "gradient_accumulation_steps") else {}
        return CallFix(_accelerator_label(names), "Accelerator", call,
                       f"accelerator = Accelerator(..., gradient_accumulation_steps={accum})\n"
                       "for batch in loader:\n"
                       "    with accelerator.accumulate(model):  # all-reduces on the last micro-step only\n"
                       "        accelerator.backward(model(**batch).loss)\n"
                       "        optimizer.step()\n"
                       "        optimizer.zero_grad()")
    return CallFix("torch DistributedDataParallel", "model.no_sync", {},
                   "import contextlib\n"
                   "for i, batch in enumerate(loader):\n"
                   f"    last = (i + 1) % {accum} == 0\n"
                   "    with contextlib.nullcontext() if last else model.no_sync():  # no all-reduce\n"
                   f"        (model(**batch).loss / {accum}).backward()\n"
                   "    if last:\n"
                   "        optimizer.step()\n"
                   "        optimizer.zero_grad()")


def find_unused_fix(names: Names) -> CallFix:
    """``find_unused_parameters=False`` where the run sets it: ``TrainingArguments``'s
    ``ddp_find_unused_parameters``, Accelerate's ``DistributedDataParallelKwargs``, Lightning's
    ``strategy="ddp"``, else the ``DistributedDataParallel`` call."""
    if names.is_trainer and names.has("ddp_find_unused_parameters"):
        return CallFix(names.library, "TrainingArguments", {"ddp_find_unused_parameters": False},
                       "TrainingArguments(..., ddp_find_unused_parameters=False)")
    if names.framework == "lightning":
        return CallFix("lightning Trainer", "Trainer", {"strategy": "ddp"},
                       'Trainer(..., strategy="ddp")  # not "ddp_find_unused_parameters_true"')
    if names.framework == "accelerate":
        return CallFix("accelerate DistributedDataParallelKwargs", "DistributedDataParallelKwargs",
                       {"find_unused_parameters": False},
                       "from accelerate import DistributedDataParallelKwargs\n"
                       "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                       "find_unused_parameters=False)])")
    return CallFix("torch DistributedDataParallel", "DistributedDataParallel", {"find_unused_parameters": False},
                   "model = DistributedDataParallel(model, find_unused_parameters=False)\n"
                   "# or, if some parameter is unused the same way every step: static_graph=True")


def reshard_fix(names: Names, fsdp: int) -> CallFix:
    """Keep FSDP's gathered parameters from forward to backward (ZeRO-2): ``reshard_after_forward=False``
    with FSDP2 (``fully_shard``), ``ShardingStrategy.SHARD_GRAD_OP`` with FSDP1, in the call the run used."""
    v2 = fsdp == 2
    if names.is_trainer:
        cfg: dict[str, Any] = {"fsdp_config": {"reshard_after_forward": False}} if v2 else {"fsdp": "shard_grad_op auto_wrap"}
        text = ("fsdp_config={..., 'reshard_after_forward': False}" if v2 else 'fsdp="shard_grad_op auto_wrap"')
        return CallFix(names.library, "TrainingArguments", cfg, f"TrainingArguments(..., {text})")
    if names.framework == "lightning":
        return CallFix("lightning FSDPStrategy", "FSDPStrategy", {"sharding_strategy": "SHARD_GRAD_OP"},
                       'Trainer(..., strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"))')
    if names.framework == "accelerate":
        value: Any = False if v2 else "SHARD_GRAD_OP"
        return CallFix("accelerate FullyShardedDataParallelPlugin", "FullyShardedDataParallelPlugin",
                       {"reshard_after_forward": value},
                       "from accelerate import FullyShardedDataParallelPlugin\n"
                       f"plugin = FullyShardedDataParallelPlugin(..., reshard_after_forward={value!r})\n"
                       "accelerator = Accelerator(..., fsdp_plugin=plugin)")
    if v2:
        return CallFix("torch fully_shard", "fully_shard", {"reshard_after_forward": False},
                       "for block in model.blocks:\n"
                       "    fully_shard(block, reshard_after_forward=False)  # gathered once a step\n"
                       "fully_shard(model, reshard_after_forward=False)")
    return CallFix("torch FullyShardedDataParallel", "FullyShardedDataParallel",
                   {"sharding_strategy": "SHARD_GRAD_OP"},
                   "from torch.distributed.fsdp import ShardingStrategy\n"
                   "model = FullyShardedDataParallel(model, ..., sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)")


def overlap_fix(names: Names, bucket_cap_mb: float | None, on_gpu: bool) -> CallFix:
    """Hide the all-reduce behind backward: smaller first buckets, gradients as bucket views,
    and a compression hook halving the bytes (bf16 with NCCL, fp16 elsewhere)."""
    cap = max(1, int((bucket_cap_mb or 25) // 2))
    hook = "bf16_compress_hook" if on_gpu else "fp16_compress_hook"
    snippet = (f"model = DistributedDataParallel(model, bucket_cap_mb={cap}, gradient_as_bucket_view=True)\n"
               "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
               f"model.register_comm_hook(None, default_hooks.{hook})  # half the bytes on the wire")
    if names.is_trainer and names.has("ddp_bucket_cap_mb"):
        return CallFix(names.library, "TrainingArguments", {"ddp_bucket_cap_mb": cap}, snippet)
    return CallFix("torch DistributedDataParallel", "DistributedDataParallel",
                   {"bucket_cap_mb": cap, "gradient_as_bucket_view": True}, snippet)
