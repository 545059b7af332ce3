"""Which fix ``gpudoctor try`` applies, and which of its values the hooks can set.

A fix is one or more tables, each the arguments of one call (the finding's ``config`` with
its ``call``, then ``also``). The hooks can set ``TrainingArguments`` fields, a few
``DataLoader`` arguments and tokenizer call arguments; anything else (``ds.map``, a
collator, a custom loop's save interval, an upgrade) is the user's code, and the trial says
so instead of pretending. A value equal to what the baseline already ran is not a change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.common.errors import UserError
from gpudoctor.core.schema import Finding, FixTable, NotApplied, Report
from gpudoctor.hooks.apply import (
    DDP_KEYS,
    DDP_SYNC_KEYS,
    FSDP1_KEYS,
    FULLY_SHARD_KEYS,
    LOADER_KEYS,
    MODEL_CHECKPOINT_KEYS,
    SAVE_KEYS,
    SCHEMA,
    TOKENIZER_KEYS,
)
from gpudoctor.rules import script_flags
from gpudoctor.rules.base import LOOP_LIBRARY
from gpudoctor.rules.names import Names, names_for

TARGETS = {"TrainingArguments": "training_arguments", "DataLoader": "dataloader", "tokenizer": "tokenizer",
           "torch.save": "torch_save", "ModelCheckpoint": "model_checkpoint", "DistributedDataParallel": "ddp",
           "model.no_sync": "ddp_sync",
           "fully_shard": "fully_shard", "FullyShardedDataParallel": "fsdp1"}
# The settable keyword arguments of each target the hooks change a call of (TrainingArguments: its fields).
_TARGET_KEYS: dict[str, dict[str, Any]] = {"dataloader": LOADER_KEYS, "tokenizer": TOKENIZER_KEYS,
                                           "torch_save": SAVE_KEYS, "ddp": DDP_KEYS,
                                           "fully_shard": FULLY_SHARD_KEYS, "fsdp1": FSDP1_KEYS,
                                           "ddp_sync": DDP_SYNC_KEYS}
LOOP = LOOP_LIBRARY  # a table of the loop's own code (rules.base)
COMMAND_LINE = "command_line"  # a Part's target: the script's own flags, set by running the edited command
_CODE_REASONS = {
    "ds.map": "datasets.map runs in the script before training: pre-processing it needs a code change",
    "DataCollatorWithPadding": "the collator is built in the script: passing it needs a code change",
}


@dataclass
class Part:
    """One table of the fix: what the trial sets, what already ran, what needs the user's code."""

    call: str | None
    library: str | None
    target: str | None  # the Overrides section its values go to; None: not settable by the hooks
    apply: dict[str, Any] = field(default_factory=dict)
    unchanged: dict[str, Any] = field(default_factory=dict)
    code_change: dict[str, str] = field(default_factory=dict)  # key -> why the hooks cannot set it
    thinned: dict[str, int] | None = None  # torch.save thinning: the save_steps it stands for

    def to_dict(self) -> dict[str, Any]:
        out = {"call": self.call, "library": self.library, "apply": self.apply,
               "unchanged": self.unchanged, "code_change": self.code_change}
        if self.thinned:
            out["thinned"] = self.thinned
        return out


@dataclass
class Plan:
    rule: str
    finding: Finding
    parts: list[Part]
    user_set: dict[str, Any] = field(default_factory=dict)

    @property
    def applicable(self) -> bool:
        return any(p.apply for p in self.parts)

    @property
    def complete(self) -> bool:
        """Every value of the fix is either set by the trial or already what ran."""
        return self.applicable and not any(p.code_change for p in self.parts)

    def command(self, ran: list[str]) -> list[str] | None:
        """The trial's command when the fix is set through the script's own flags: the finding's
        edited command line, if it starts as the command that ran (else None: the command as given)."""
        if not any(p.target == COMMAND_LINE and p.apply for p in self.parts):
            return None
        argv = (self.finding.get("data") or {}).get("command_argv")
        if not (isinstance(argv, list) and argv and all(isinstance(x, str) for x in argv)):
            return None
        return argv if ran and argv[0] == ran[0] and argv != ran else None

    @property
    def workers(self) -> int | None:
        for p in self.parts:
            for key in ("num_workers", "dataloader_num_workers"):
                if isinstance(p.apply.get(key), int):
                    return int(p.apply[key])
        return None

    def spec(self) -> dict[str, Any]:
        """The JSON the hooks read (:mod:`gpudoctor.hooks.apply`)."""
        out: dict[str, Any] = {"schema": SCHEMA, "rule": self.rule}
        for p in self.parts:
            if p.target and p.target != COMMAND_LINE and p.apply:
                out.setdefault(p.target, {}).update(p.apply)
        return out

    def not_applied(self) -> list[NotApplied]:
        return [{"call": p.call, "key": k, "reason": why} for p in self.parts for k, why in p.code_change.items()]


def tables(finding: Finding) -> list[FixTable]:
    fix = finding["fix"]
    main: FixTable = {"library": fix.get("library"), "call": fix.get("call"), "config": fix.get("config") or {}}
    also = [t for t in fix.get("also") or [] if isinstance(t, dict)]
    return [t for t in [main, *also] if t.get("config")]


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``--set KEY=VALUE``: VALUE as JSON (2, true, null) when it parses, else as text."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UserError(f"--set {item!r} is not KEY=VALUE (e.g. --set num_workers=2)")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if isinstance(value, (list, dict)):
            raise UserError(f"--set {key}: a single value, not {type(value).__name__}")
        out[key] = value
    return out


def make_plan(report: Report, a: Analysis, rule: str | None, sets: dict[str, Any]) -> Plan | None:
    """The plan for ``rule``, else for the top finding whose fix the hooks can apply fully, else
    partly, else the top finding's (nothing applicable). None: no finding at all."""
    findings = [f for f in report.get("findings") or [] if f.get("severity") != "info"]
    names = names_for(a.primary)
    if rule is not None:
        chosen = [f for f in findings if f.get("rule") == rule]
        if not chosen:
            found = ", ".join(str(f.get("rule")) for f in findings) or "none"
            raise UserError(f"--fix {rule}: the baseline has no such finding (found: {found}); "
                            "pick one of those, or leave --fix out for the top one")
        return _plan(chosen[0], names, a, sets)
    plans = [_plan(f, names, a, sets) for f in findings]
    return (next((p for p in plans if p.complete), None) or next((p for p in plans if p.applicable), None)
            or (plans[0] if plans else None))


def _plan(finding: Finding, names: Names, a: Analysis, sets: dict[str, Any]) -> Plan:
    parts = [_part(t, names, a, finding) for t in tables(finding)]
    flags = [p for p in parts if p.target == COMMAND_LINE]
    if flags and (finding.get("data") or {}).get("flags_cover_fix") is True:
        parts = flags  # the script's flags carry every value: the trial runs the edited command alone
    no_sync = _no_sync(finding)
    if no_sync is not None:
        parts.insert(0, no_sync)
    for key, value in sets.items():  # every key was checked before the baseline: none is refused here
        part = _part_for(key, parts, names)
        part.unchanged.pop(key, None)
        part.code_change.pop(key, None)
        if part.target is None:
            part.code_change[key] = f"{part.call or part.library} is the script's own code, not a setting"
        else:
            part.apply[key] = value
        if part not in parts:
            parts.append(part)
    return Plan(str(finding.get("rule")), finding, parts, user_set=dict(sets))



def _thinned_saves(table: FixTable, finding: Finding) -> Part | None:
    """A hand-written loop's save interval is its own code, but its ``torch.save`` calls are
    ours to thin in the trial: keep every k-th, k = the finding's ``save_steps`` ÷ the interval
    that ran (rounded up), so the trial runs as ``save_steps = interval × k`` would."""
    config = table.get("config") or {}
    data = finding.get("data") or {}
    new, now = config.get("save_steps"), data.get("current_save_steps")
    if table.get("library") != LOOP or set(config) != {"save_steps"} or not isinstance(new, int):
        return None
    if not isinstance(now, (int, float)) or now < 1 or new <= now:
        return None
    k = -(-new // int(now))
    part = Part("torch.save", LOOP, "torch_save", apply={"keep_every": k})
    part.thinned = {"save_steps": new, "ran_every": int(now), "trial_every": int(now) * k}
    return part


def _no_sync(finding: Finding) -> Part | None:
    """``no_sync()`` on all but the last micro-step is the script's own loop, but DDP's switch for it
    (``require_backward_grad_sync``) is the hooks' to set before each forward: the trial all-reduces
    once every ``micro_steps`` forwards, as the fix would (Accelerate's ``accumulate`` does the same)."""
    micro = (finding.get("data") or {}).get("micro_steps")
    if finding.get("rule") != "sync_every_microstep" or not isinstance(micro, int) or micro < 2:
        return None
    return Part("model.no_sync", "torch DistributedDataParallel", "ddp_sync", apply={"every": micro})


# The call each settable key belongs to, when the finding's own tables do not name it.
_KEY_CALLS = (("DataLoader", LOADER_KEYS), ("tokenizer", TOKENIZER_KEYS), ("ModelCheckpoint", MODEL_CHECKPOINT_KEYS),
              ("DistributedDataParallel", DDP_KEYS), ("fully_shard", FULLY_SHARD_KEYS),
              ("FullyShardedDataParallel", FSDP1_KEYS))


def _part_for(key: str, parts: list[Part], names: Names) -> Part:
    """The table a ``--set`` key changes: the finding's table that has it, else the one whose call
    takes it (the main table first), else a table of its own call."""
    for p in parts:
        if key in p.apply or key in p.unchanged or key in p.code_change:
            return p
    for p in parts:
        if p.target and _settable(p.target, key, names):
            return p
    if names.is_trainer and key in names.trainer_fields:
        return Part("TrainingArguments", names.library, "training_arguments")
    if names.is_trainer and key in LOADER_KEYS:  # the Trainer builds the loader: its field, not ours
        part = Part("TrainingArguments", names.library, None)
        part.code_change[key] = f"the Trainer builds the DataLoader: set dataloader_{key} instead"
        return part
    for call, keys in _KEY_CALLS:
        if key in keys:
            return Part(call, None, TARGETS[call])
    part = Part("TrainingArguments", None, None)
    part.code_change[key] = "this run has no Hugging Face Trainer: a TrainingArguments field cannot be set"
    return part


def check_sets(sets: dict[str, Any]) -> None:
    """Refuse a ``--set`` the trial could never set, before anything runs (a one-line error).

    A key must be an argument the hooks set: a DataLoader, tokenizer or ModelCheckpoint one (its
    value of that argument's type), or a field of the installed ``TrainingArguments``.
    """
    unknown = []
    for key, value in sets.items():
        kinds = [keys[key] for _, keys in _KEY_CALLS if key in keys]
        if kinds:
            if not any(_of_type(value, k) for k in kinds):
                raise UserError(f"--set {key}={value!r}: {key} takes {_type_words(kinds[0])}")
            continue
        unknown.append(key)
    if not unknown:
        return
    fields = _training_argument_fields()
    for key in unknown:
        if key not in fields:
            raise UserError(
                f"--set {key}: not an argument the trial can set (DataLoader: {', '.join(LOADER_KEYS)}; "
                f"tokenizer: {', '.join(TOKENIZER_KEYS)}; ModelCheckpoint: {', '.join(MODEL_CHECKPOINT_KEYS)}; "
                f"DistributedDataParallel: {', '.join(DDP_KEYS)}; fully_shard: {', '.join(FULLY_SHARD_KEYS)}; "
                f"FullyShardedDataParallel: {', '.join(FSDP1_KEYS)}"
                + ("; or a field of the installed transformers' TrainingArguments)" if fields else
                   "; TrainingArguments fields need transformers, which is not installed here)"))


def _of_type(value: Any, kind: Any) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _type_words(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "a whole number", bool: "true or false", str: "text"}.get(k, k.__name__) for k in kinds)


def _training_argument_fields() -> set[str]:
    """The installed ``TrainingArguments`` fields (empty without transformers), read from its
    source with ``ast``: importing transformers would cost seconds before a refusal."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transformers")
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    if not where:
        return set()
    try:
        tree = ast.parse((Path(where[0]) / "training_args.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return set()


def _settable(target: str | None, key: str, names: Names) -> bool:
    if target in _TARGET_KEYS:
        return key in _TARGET_KEYS[target]
    if target == "model_checkpoint":
        return key in MODEL_CHECKPOINT_KEYS and key in set((names.lightning or {}).get("params") or [key])
    return target == "training_arguments" and (not names.trainer_fields or key in names.trainer_fields)


def _part(table: FixTable, names: Names, a: Analysis, finding: Finding | None = None) -> Part:
    thinned = _thinned_saves(table, finding) if finding is not None else None
    if thinned is not None:
        return thinned
    call = table.get("call")
    target = TARGETS.get(call) if isinstance(call, str) else None
    if table.get("library") == script_flags.LIBRARY:
        return Part(call, table.get("library"), COMMAND_LINE, apply=dict(table.get("config") or {}))
    part = Part(call, table.get("library"), target)
    saw_tokenizer = any(p.tokenize_calls for p in a.procs)
    for key, value in (table.get("config") or {}).items():
        reason = _why_not(target, key, value, names, saw_tokenizer, table)
        if reason:
            part.code_change[key] = reason
        elif _current(target, key, names) == value:
            part.unchanged[key] = value
        else:
            part.apply[key] = value
    return part


def _why_not(target: str | None, key: str, value: Any, names: Names, saw_tokenizer: bool,
             table: FixTable) -> str | None:
    if target is None:
        call = table.get("call")
        if isinstance(call, str) and call in _CODE_REASONS:
            return _CODE_REASONS[call]
        if table.get("library") == "pip":
            return "an upgrade, not a setting: install it, then measure again"
        return f"{table.get('library') or 'the script'} is the script's own code: it needs a code change"
    if value is not None and not isinstance(value, (int, float, bool, str)):
        return "not a single value the hooks can pass"
    if not _settable(target, key, names):
        return f"not an argument the hooks set on {table.get('call')}"
    if target == "tokenizer" and not saw_tokenizer:
        return "the hooks saw no tokenizer call in this run (pre-tokenized data): it needs a code change"
    return None


def _current(target: str | None, key: str, names: Names) -> Any:
    if target == "training_arguments":
        return names.args.get(key, object())
    if target == "dataloader" and names.loader is not None:
        return names.loader.get(key, object())
    if target == "model_checkpoint" and names.lightning is not None:
        return (names.lightning.get("args") or {}).get(key, object())
    return object()  # unknown: never equal, so the value is applied
