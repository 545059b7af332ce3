"""The training loops a replay runs: a plain PyTorch loop, or ``transformers.Trainer``.

Both stop at ``max_steps`` optimizer steps or ``max_seconds`` of training, whichever
comes first, and report what happened (steps, losses, checkpoint costs).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from gpudoctor.replay.bounds import Bounds, LoopResult
from gpudoctor.replay.build import Pipeline, build_loader
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.replay.measure import checkpoint_once
from gpudoctor.replay.scratch import scratch_dir


def pick_device(cfg: ReplayConfig) -> torch.device:
    want = cfg.replay.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _autocast(cfg: ReplayConfig, device: torch.device) -> Any:
    """bf16/fp16 autocast on a GPU only: on CPU the replay measures the input side."""
    tr = cfg.training
    if device.type == "cuda" and (tr.bf16 or tr.fp16):
        return torch.autocast("cuda", dtype=torch.bfloat16 if tr.bf16 else torch.float16)
    return contextlib.nullcontext()


def run_plain(
    cfg: ReplayConfig, pipe: Pipeline, model: torch.nn.Module, bounds: Bounds, device: torch.device
) -> LoopResult:
    """A hand-written loop: DataLoader, forward, backward, accumulation, torch.save."""
    tr = cfg.training
    if device.type == "cuda" and tr.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tr.tf32
        torch.backends.cudnn.allow_tf32 = tr.tf32
    model.to(device).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=tr.learning_rate, weight_decay=tr.weight_decay
    )
    loader = build_loader(
        cfg, pipe, tr.dataloader_pin_memory and device.type == "cuda"
    )  # pinning needs a GPU
    result = LoopResult()
    start = time.perf_counter()
    epochs = max(1, int(tr.num_train_epochs + 0.999))
    with scratch_dir("ckpt") as ckpt_dir:  # in the run folder, removed even on an exception
        for _ in range(epochs):
            if _epoch(cfg, pipe, model, optimizer, loader, bounds, device, ckpt_dir, result, start):
                break
        else:
            result.stopped_by = "epochs"
    result.seconds = time.perf_counter() - start
    return result


def _epoch(
    cfg: ReplayConfig,
    pipe: Pipeline,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    bounds: Bounds,
    device: torch.device,
    ckpt_dir: Path,
    result: LoopResult,
    start: float,
) -> bool:
    """One pass over the loader; True when a bound stopped training."""
    accum = cfg.training.gradient_accumulation_steps
    for batch in loader:
        if pipe.loop_work is not None:
            batch = pipe.loop_work(batch)
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with _autocast(cfg, device):
            loss = model(**batch).loss / accum
        loss.backward()
        result.micro_steps += 1
        result.samples += int(batch["input_ids"].shape[0])
        if result.micro_steps % accum == 0:
            if cfg.training.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps += 1
            result.losses.append(float(loss.detach()) * accum)
            if bounds.save_steps and result.steps % bounds.save_steps == 0:
                seconds, size = checkpoint_once(model, optimizer, ckpt_dir)
                result.checkpoint_s.append(seconds)
                result.checkpoint_bytes = size
            if result.steps >= bounds.max_steps:
                result.stopped_by = "steps"
                return True
        if time.perf_counter() - start >= bounds.max_seconds:
            result.stopped_by = "seconds"
            return True
    return False


def run_trainer(
    cfg: ReplayConfig, pipe: Pipeline, model: Any, bounds: Bounds, device: torch.device
) -> LoopResult:
    """``transformers.Trainer`` with the config's TrainingArguments (``use_cpu`` without a GPU)."""
    on_gpu = device.type == "cuda"
    with scratch_dir("trainer") as out:
        return _train_with(cfg, pipe, model, bounds, on_gpu, out)


def _train_with(
    cfg: ReplayConfig, pipe: Pipeline, model: Any, bounds: Bounds, on_gpu: bool, out: Path
) -> LoopResult:
    from transformers import Trainer, TrainingArguments

    # imports transformers, as the line above
    from gpudoctor.replay.trainer_bounds import BoundsCallback

    tr = cfg.training
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=tr.per_device_train_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        dataloader_num_workers=tr.dataloader_num_workers,
        dataloader_pin_memory=tr.dataloader_pin_memory and on_gpu,
        dataloader_prefetch_factor=tr.dataloader_prefetch_factor,
        dataloader_persistent_workers=tr.dataloader_persistent_workers,
        dataloader_drop_last=tr.dataloader_drop_last,
        max_steps=bounds.max_steps,
        num_train_epochs=tr.num_train_epochs,
        learning_rate=tr.learning_rate,
        weight_decay=tr.weight_decay,
        warmup_steps=tr.warmup_steps,
        max_grad_norm=tr.max_grad_norm,
        seed=tr.seed,
        optim=tr.optim,
        save_strategy="steps" if bounds.save_steps else "no",
        save_steps=bounds.save_steps or 500,
        logging_steps=tr.logging_steps,
        bf16=tr.bf16 and on_gpu,
        fp16=tr.fp16 and on_gpu,
        tf32=tr.tf32 if on_gpu else None,
        gradient_checkpointing=tr.gradient_checkpointing,
        use_cpu=not on_gpu,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    callback = BoundsCallback(bounds.max_seconds, out)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=pipe.dataset,
        data_collator=pipe.collator,
        callbacks=[callback],
    )
    trainer.train()
    return callback.result(
        trainer.state, bounds, tr.gradient_accumulation_steps, tr.per_device_train_batch_size
    )
