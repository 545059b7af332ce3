"""The knob registry: every setting a fix changes, where its value is read, how each framework
spells it, how ``try`` applies it, and the one prediction of what changing it gives.

A fix is a table of keys (``config``); each key belongs to one knob here. The rules compute a
knob's value and their claims (:mod:`gpudoctor.rules.account`); :func:`predict` turns a finding's
claims into the steady-state speedup, and it is the only function that does: ``run``, ``attach``,
``replay``, ``diff`` and the renderers print the finding's ``predicted_speedup`` it set, ``try``
asks it for the finding it applies (a worker count it sets by hand included), ``sweep`` measures
instead. A key a rule emits and this registry lacks is a bug the tests catch
(``tests/test_knobs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.common.wording import plural
from gpudoctor.rules import account, data
from gpudoctor.rules.base import Finding

# How ``try`` applies a knob's values.
HOOKS = "the hooks set it on the call as the script makes it (TrainingArguments, DataLoader, tokenizer, ...)"
FLAGS = "the script's own flag, by running the edited command line"
CODE = "a code change: the trial says so and applies the rest"


@dataclass(frozen=True)
class Knob:
    """One setting a fix changes."""

    name: str
    keys: tuple[str, ...]  # the fix-table keys that are its value, as each framework spells it
    spelled: dict[str, str]  # framework -> the call and argument that take it there
    read_from: str  # where the value that ran is read
    applied: tuple[str, ...]  # how ``try`` applies it: HOOKS, FLAGS, CODE
    rules: tuple[str, ...]  # the rules whose findings prescribe it
    unit: str  # the unit of its value, as the script counts it
    script_names: tuple[str, ...] = ()  # options scripts in the wild name its value by (beside its keys)
    companions: tuple[str, ...] = ()  # keys set beside its value (persistent_workers beside num_workers)
    approximate: bool = False  # the value that ran is estimated (saves counted against steps)
    proportional: bool = False  # a script's option may count it in another unit: scaled, not set
    words: tuple[str, ...] = ()  # the values it takes where they are words: an option holding one carries it

    @property
    def aliases(self) -> frozenset[str]:
        """Every name of its value: its keys and the scripts' option names."""
        return frozenset((*self.keys, *self.script_names))


_LOOP = "a plain loop"
KNOBS: tuple[Knob, ...] = (
    Knob("max_length", ("max_length", "model_max_length"),
         {"transformers": "tokenizer(..., truncation=True, max_length=…)", _LOOP: "the rows' truncation length"},
         "the tokenizer calls' arguments and the width rows were padded to", (HOOKS, FLAGS), ("padding_waste",),
         "tokens", ("max_seq_length", "max_seq_len", "max_len", "seq_len", "seq_length", "sequence_length",
                    "block_size", "context_length"), companions=("truncation",)),
    Knob("padding", ("padding",),
         {"transformers": "tokenizer(..., padding='longest') or DataCollatorWithPadding(pad_to_multiple_of=…)",
          _LOOP: "pad each batch to its longest row in the collate function"},
         "the tokenizer calls' padding and the batches' pad tokens", (HOOKS, FLAGS, CODE), ("padding_waste",),
         "rows", ("pad", "padding_strategy", "pad_mode"), companions=("pad_to_multiple_of", "pad_to_max_length"),
         words=("longest", "max_length", "do_not_pad")),
    Knob("bucketing", ("group_by_length",),
         {"trainer": "TrainingArguments(group_by_length=True)", _LOOP: "a sampler that groups rows of like length"},
         "the batches' widths against their longest rows", (HOOKS, FLAGS, CODE), ("padding_waste",), "rows",
         companions=("packing",)),
    Knob("num_workers", ("num_workers", "dataloader_num_workers"),
         {"trainer": "TrainingArguments(dataloader_num_workers=…)", "lightning": "DataLoader(num_workers=…)",
          "accelerate": "DataLoader(num_workers=…)", _LOOP: "DataLoader(num_workers=…)"},
         "the DataLoader call (a Trainer's: TrainingArguments)", (HOOKS, FLAGS),
         ("data_stall", "io_bound", "cpu_saturated", "tokenization_in_loop"), "workers",
         ("workers", "n_workers", "loader_workers", "data_workers"),
         companions=("persistent_workers", "dataloader_persistent_workers", "prefetch_factor",
                     "dataloader_prefetch_factor", "pin_memory", "dataloader_pin_memory")),
    Knob("precompute", ("num_proc",),
         {"datasets": "ds.map(tokenize, batched=True, num_proc=…) once, before training",
          _LOOP: "each item built once before training (the script's own caching switch, where it has one)"},
         "the tokenizer's and the batch build's time on the training process", (FLAGS, CODE),
         ("tokenization_in_loop", "data_stall", "cpu_saturated"), "items",
         ("preprocessing_num_workers", "preprocessing_workers", "dataset_num_proc", "map_num_proc"),
         companions=("batched",)),
    Knob("save_steps", ("save_steps",),
         {"trainer": "TrainingArguments(save_steps=…)", "lightning": "ModelCheckpoint(every_n_train_steps=…)",
          _LOOP: "if step % save_interval == 0: torch.save(...)"},
         "the saves counted against the steps", (HOOKS, FLAGS), ("checkpoint_overhead",), "steps",
         ("save_every", "save_interval", "save_freq", "save_every_n_steps", "checkpoint_every",
          "checkpoint_interval", "checkpoint_steps", "ckpt_every", "ckpt_interval"),
         companions=("every_n_train_steps", "save_only_model", "save_weights_only", "save_total_limit"),
         approximate=True),
    Knob("eval_interval", ("eval_steps", "eval_interval"),
         {"trainer": "TrainingArguments(eval_steps=…)", "lightning": "Trainer(val_check_interval=…)",
          _LOOP: "if step % eval_interval == 0: evaluate()"},
         "the evaluations counted against the steps", (HOOKS, FLAGS, CODE), ("eval_overhead",), "steps",
         ("eval_every", "eval_freq", "eval_every_n_steps", "val_interval", "val_every", "validation_interval"),
         companions=("val_check_interval", "eval_strategy", "evaluation_strategy")),
    Knob("eval_batches", ("eval_iters", "max_eval_batches", "eval_batches"),
         {"trainer": "a smaller eval_dataset", "lightning": "Trainer(limit_val_batches=…)",
          _LOOP: "for _ in range(eval_iters): ..."},
         "the forwards of one evaluation, measured", (FLAGS, CODE), ("eval_overhead",), "batches",
         ("num_eval_batches", "eval_max_batches", "val_iters", "val_batches", "limit_val_batches"),
         companions=("limit_val_batches",), proportional=True),
    Knob("eval_batch_size", ("per_device_eval_batch_size", "eval_batch_size"),
         {"trainer": "TrainingArguments(per_device_eval_batch_size=…)", _LOOP: "the eval DataLoader's batch_size"},
         "the eval batches' rows", (HOOKS, FLAGS), ("eval_overhead",), "rows", ("val_batch_size",)),
    Knob("batch_size", ("per_device_train_batch_size", "batch_size"),
         {"trainer": "TrainingArguments(per_device_train_batch_size=…)", "lightning": "DataLoader(batch_size=…)",
          "accelerate": "DataLoader(batch_size=…)", _LOOP: "DataLoader(batch_size=…)"},
         "the DataLoader call (a Trainer's: TrainingArguments) and the batches' rows", (HOOKS, FLAGS),
         ("small_batch", "gpu_memory_underused", "low_gpu_utilization"), "rows",
         ("train_batch_size", "micro_batch_size")),
    Knob("accumulation", ("gradient_accumulation_steps",),
         {"trainer": "TrainingArguments(gradient_accumulation_steps=…)",
          "lightning": "Trainer(accumulate_grad_batches=…)",
          "accelerate": "Accelerator(gradient_accumulation_steps=…)", _LOOP: "an optimizer step every N batches"},
         "TrainingArguments, or the optimizer steps counted against the batches", (HOOKS, FLAGS),
         ("small_batch", "sync_every_microstep"), "batches",
         ("grad_accum", "grad_accum_steps", "accumulation_steps", "gradient_accumulation", "accum_steps"),
         companions=("accumulate_grad_batches",)),
    Knob("precision", ("bf16", "fp16", "tf32", "mixed_precision", "precision"),
         {"trainer": "TrainingArguments(bf16=True, tf32=True)", "lightning": "Trainer(precision='bf16-mixed')",
          "accelerate": "Accelerator(mixed_precision='bf16')",
          _LOOP: "torch.autocast(device, torch.bfloat16); torch.backends.cuda.matmul.allow_tf32 = True"},
         "torch's matmul settings, the parameters' dtype and autocast", (HOOKS, CODE),
         ("no_tf32", "no_mixed_precision", "low_mfu"), "dtype",
         companions=("torch_compile", "allow_tf32", "matmul_precision")),
    Knob("ddp", ("find_unused_parameters", "ddp_find_unused_parameters", "bucket_cap_mb", "ddp_bucket_cap_mb"),
         {"trainer": "TrainingArguments(ddp_find_unused_parameters=False, ddp_bucket_cap_mb=…)",
          "lightning": "DDPStrategy(find_unused_parameters=False)", _LOOP: "DistributedDataParallel(model, ...)"},
         "the DistributedDataParallel call", (HOOKS,),
         ("unused_parameter_search", "exposed_communication", "sync_every_microstep"), "flags",
         companions=("static_graph", "gradient_as_bucket_view", "no_sync")),
    Knob("fsdp", ("reshard_after_forward",),
         {"trainer": "TrainingArguments(fsdp=…)", _LOOP: "fully_shard(model, reshard_after_forward=…)"},
         "the fully_shard / FullyShardedDataParallel call", (HOOKS,), ("fsdp_backward_allgather",), "flags",
         companions=("sharding_strategy", "fsdp")),
)

_BY_KEY: dict[str, Knob] = {key: k for k in KNOBS for key in (*k.keys, *k.companions)}


def knob_for(key: str) -> Knob | None:
    """The knob a fix-table key sets (its value or a companion), or None."""
    return _BY_KEY.get(key)


def aliases(key: str) -> frozenset[str] | None:
    """Option names that mean the same value as ``key`` in scripts seen in the wild (a companion has none)."""
    k = _BY_KEY.get(key)
    return k.aliases if k is not None and key in k.keys else None


def words(key: str) -> frozenset[str]:
    """The words ``key``'s knob takes as values (empty: its values are numbers or switches)."""
    k = _BY_KEY.get(key)
    return frozenset(k.words) if k is not None else frozenset()


APPROXIMATE = frozenset(key for k in KNOBS if k.approximate for key in k.keys)
PROPORTIONAL = frozenset(key for k in KNOBS if k.proportional for key in k.keys)


@dataclass
class Prediction:
    speedup: float | None
    up_to: float | None
    basis: str


def predict(a: Analysis, findings: list[Finding], rule: str, workers: int | None = None) -> Prediction:
    """Steps/s after the fix over steps/s now: the one prediction of a knob's value.

    A finding's own figure (its claims settled on the training loop's buckets, startup left out:
    :func:`gpudoctor.rules.base.settle_findings`, which every mode prints); a worker count set by
    hand (``try --set num_workers=N``) by the data rules' loop model for that count
    (:func:`gpudoctor.rules.data.loop_batch_s`), which is where the findings' worker figures come from.
    ``findings``: the rules' findings on ``a``, as the report was built from them (run once).
    """
    if workers is not None:
        d = data.data_wait(a)
        per_batch = data.loop_batch_s(d, workers) if d is not None else None
        if d is None or per_batch is None or not d.batch_s:
            return Prediction(None, None, "workers: batch build cost or compute per batch not measured")
        low, high = d.batch_s / per_batch[0], d.batch_s / per_batch[1]
        return Prediction(low, high if high > low + 5e-4 else None,
                          f"loop time per batch with {plural(workers, 'worker')}, from the measured batch build "
                          "cost, compute per batch and free cores (the data rules' model)")
    finding = next((f for f in findings if f.rule == rule), None)
    if finding is None or not finding.claims:
        return Prediction(None, None, "the finding claims no seconds of the training loop")
    if finding.predicted_speedup is None and account.loop_shares(a.breakdown()) is None:
        return Prediction(None, None, "no training loop measured")
    return Prediction(finding.predicted_speedup or 1.0, finding.speedup_up_to,
                      f"{rule}'s claims on the training loop's seconds (startup left out)")
