"""Say a fix in the script's own terms: its flags, and the whole edited command line.

Run after every rule: a fix value whose knob the script takes on its command line
(recorded by :mod:`gpudoctor.hooks.cli_hooks`) becomes "run with ``--save_steps 500``
instead of 5", one table for "your command line" and the edited command. A key maps
to an option of the same name, or to one whose name is a known alias of that knob
(``save_every`` for ``save_steps``, ``preprocessing_num_workers`` for ``num_proc``), and
only when the option holds the value the run used where that is known. Everything
else keeps the library's names.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.process import ProcessView
from gpudoctor.rules import account, knobs
from gpudoctor.rules.base import Finding, Table
from gpudoctor.rules.data import PRECOMPUTE
from gpudoctor.rules.names import names_for

LIBRARY = "your command line"

@dataclass
class Option:
    dest: str
    flags: list[str]
    default: Any
    value: Any
    takes_value: bool
    const: Any
    choices: list[Any] | None = None  # the values argparse accepts, when it said

    def names(self) -> set[str]:
        return {_norm(self.dest)} | {_norm(f) for f in self.flags}


@dataclass
class ScriptCli:
    style: str  # "argparse" | "globals"
    options: list[Option]
    prefix: list[str]  # what runs the script: "python", "torchrun --nproc-per-node 2"...
    args: list[str]  # the script and its arguments, as recorded (redacted)


def apply(a: Analysis, findings: list[Finding]) -> None:
    """Add the script's flags to every fix they can carry, in place."""
    p = a.primary
    cli = script_cli(p, a.rec.meta.get("command"))
    if cli is None:
        return
    for finding in findings:
        _apply_one(a, p, cli, finding)


def script_cli(p: ProcessView | None, command: Any) -> ScriptCli | None:
    """The options the primary process parsed from its own command line, if any."""
    if p is None:
        return None
    events = [e for e in p.records.cli if e.get("from_argv") is True]
    style = "argparse" if any(e.get("style") == "argparse" for e in events) else "globals"
    merged: dict[str, Option] = {}
    for e in events:
        if e.get("style") == style:
            for raw in e["options"]:
                opt = _option(raw)
                if opt is not None:
                    merged[opt.dest] = opt
    argv = p.proc.get("argv")
    if not merged or not isinstance(argv, list) or len(argv) < 2:
        return None
    prefix, args = _split_command(argv, command)
    return ScriptCli(style, list(merged.values()), prefix, args)


def _option(raw: Any) -> Option | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("dest"), str):
        return None
    flags = [f for f in raw.get("flags") or [] if isinstance(f, str) and f.startswith("-")]
    if not flags:
        return None  # a positional: not something to set by name
    choices = raw.get("choices")
    return Option(raw["dest"], flags, raw.get("default"), raw.get("value"), raw.get("takes_value") is not False,
                  raw.get("const"), choices if isinstance(choices, list) else None)


def _split_command(argv: list[str], command: Any) -> tuple[list[str], list[str]]:
    """(launcher, script + args): the launcher as the user typed it when the tail matches."""
    script_args = [str(x) for x in argv[1:]]
    cmd = [str(x) for x in command] if isinstance(command, list) else []
    rest = script_args[1:]
    if rest and cmd[-len(rest):] == rest and len(cmd) > len(rest):
        return cmd[: len(cmd) - len(rest) - 1], [cmd[len(cmd) - len(rest) - 1], *rest]
    if not rest and cmd and os.path.basename(cmd[-1]) == os.path.basename(script_args[0]):
        return cmd[:-1], [cmd[-1]]
    return ["python"], script_args


@dataclass
class _Change:
    option: Option
    value: Any


@dataclass(frozen=True)
class _Flags:
    """The options that carry a fix's values (and its alternative's): worded by ``_word``."""

    changes: list[_Change]
    alt: list[_Change]
    leftover: bool  # some value of the fix has no option: the library's snippet stays first
    promise: float | None = None  # a switch that caches whole items: its own speedup, said beside it


def _apply_one(a: Analysis, p: ProcessView | None, cli: ScriptCli, finding: Finding) -> None:
    fix = finding.fix
    tables = [Table(fix.library or "", fix.call, fix.config), *fix.also]
    changes, leftover = _changes(a, p, cli, finding, [t.config for t in tables])
    switch = _precompute_switch(cli, finding.data.get(PRECOMPUTE))
    promise: float | None = None  # set only for a switch that caches whole items
    if switch is not None:  # the script's own switch does what the library's values say: it alone
        changes, leftover = [_Change(switch, switch.const)], False
        caches = _caches(switch)
        if caches and finding.switch_claims.get("cache"):
            # named for caching items, not for tokenizing: each whole item once, the whole build gone;
            # its figure is the one the claims settle to (the finding's predicted_speedup), said first
            finding.claims = finding.switch_claims["cache"]
            finding.data["switch_kind"] = "cache"
            promise = account.steady_speedup(a.breakdown(), finding.claims)
            fix.summary = (f"{fix.summary} Its own switch {_flag(cli, switch)} caches each whole item, so the "
                           "whole batch build leaves the loop, not only the tokenizing: that is the promise"
                           + (" (the figures above are the alternatives')." if promise else "."))
        whole = finding.data.get("switch_kind", finding.data.get(PRECOMPUTE)) == "cache"  # the build gone
        idle = _workers_off(a, p, cli, finding) if caches and whole else []
        if idle:
            changes += idle
            fix.summary = (f"{fix.summary} With the items in memory the loop reads each batch itself "
                           f"({_flag(cli, idle[0].option)} 0): a worker would only add the trip through its queue "
                           "to every batch, which the promise does not hold.")
    alternative = finding.data.get("alternative")
    alt, _ = _changes(a, p, cli, finding, [alternative]) if isinstance(alternative, dict) else ([], False)
    alt_switch = _precompute_switch(cli, finding.data.get("alternative_precompute"))
    if alt_switch is not None:
        alt = [_Change(alt_switch, alt_switch.const)]
    if changes or alt:
        _word(cli, finding, _Flags(changes, alt, leftover, promise))


def _workers_off(a: Analysis, p: ProcessView | None, cli: ScriptCli, finding: Finding) -> list[_Change]:
    """The script's worker count set to 0 beside a switch that caches whole items, where the run had
    workers: the promise is the compute back to back, and cached batches still sent through a worker
    pay its queue (issue #40, prove.py loop 83: cached through 1 worker 43-59 steps/s, in the loop
    59-76, 2.4-6.2 ms a step against 0.2 ms waiting for the batch)."""
    option = _option_for(cli, "num_workers")
    if option is None or not _number(option.value) or option.value <= 0:
        return []
    changes, _ = _changes(a, p, cli, finding, [{"num_workers": 0}])  # the option's checks, as every value's
    return changes


def _word(cli: ScriptCli, finding: Finding, flags: _Flags) -> None:
    """The fix said with the script's flags: its summary led by them, its table and command line."""
    fix, changes, alt = finding.fix, flags.changes, flags.alt
    said = []
    if changes:
        said.append("Run with " + _said(cli, changes)
                    + (f" (about {flags.promise:.2f}x faster per batch)" if flags.promise else ""))
        fix.also = [*fix.also, Table(LIBRARY, None, {_flag(cli, c.option): c.value for c in changes})]
    if alt:
        said.append(("or" if changes else "Run") + " with " + _said(cli, alt))
    fix.summary = ", ".join(said) + "." + (f" {fix.summary}" if fix.summary else "")
    lines = [shlex.join([*cli.prefix, *edit_args(cli, ch)]) for ch in (changes, alt) if ch]
    command = "\n# or:\n".join(lines)
    if (flags.leftover or not changes) and fix.snippet:
        fix.snippet = f"{fix.snippet}\n# with your script's flags:\n# " + command.replace("\n", "\n# ")
    else:
        fix.snippet = command
    finding.data["command_line"] = lines[0]
    # what ``try`` runs: the user's command with the script's flags edited (the same knob and value)
    finding.data["command_argv"] = [*cli.prefix, *edit_args(cli, changes or alt)]
    finding.data["flags_cover_fix"] = bool(changes) and not flags.leftover


def _changes(a: Analysis, p: ProcessView | None, cli: ScriptCli, finding: Finding,
             configs: list[dict[str, Any]]) -> tuple[list[_Change], bool]:
    """The options that carry the values of ``configs``, and whether some value has none."""
    changes: list[_Change] = []
    leftover = False
    for config in configs:
        for key, wanted in config.items():
            option = _option_for(cli, key)
            current = _current(a, p, finding, key)
            value = _scaled(option, wanted, current) if option and key in knobs.PROPORTIONAL else wanted
            if option is None or value is None or not _holds(option, key, value) or (
                    key not in knobs.PROPORTIONAL and not _agrees(option.value, current, key in knobs.APPROXIMATE)):
                leftover = True
                continue
            if _same(option.value, value) or any(c.option is option for c in changes):
                continue
            if _spell(cli, option, value) is None:
                leftover = True
                continue
            changes.append(_Change(option, value))
    return changes, leftover


def _holds(option: Option, key: str, value: Any) -> bool:
    """Whether the option can take ``value``: one of its choices where argparse lists them; a word
    value (``padding="longest"``) only into an option listing it, or holding another of the
    knob's words now (a ``--pad`` that takes a token id never gets "longest")."""
    if option.choices is not None:
        return value in option.choices
    if isinstance(value, str) and value in knobs.words(key):
        return isinstance(option.value, str) and option.value in knobs.words(key)
    return True


def _scaled(option: Option, wanted: Any, current: Any) -> Any:
    """An eval-batches value in the option's unit: nanoGPT's ``eval_iters`` runs per split, so
    the forwards the run measured per eval are a multiple of it."""
    if not (_number(wanted) and _number(current) and _number(option.value)) or current <= 0:
        return wanted if current is None else None
    return max(1, round(option.value * wanted / current))


def _said(cli: ScriptCli, changes: list[_Change]) -> str:
    return " and ".join(f"`{_spell(cli, c.option, c.value)}` instead of {_was(cli, c.option)}" for c in changes)


# What a pre-computing fix's switch may be called: for the tokenizer's part only, or for the whole
# item (which also does the tokenizer's part).
_PRETOKENIZE_ONLY = ("pretokenize", "pre_tokenize", "tokenize_once", "tokenize_offline")
_WHOLE_ITEM = ("cache", "cache_items", "cache_dataset", "precompute", "preload", "in_memory")
_SWITCHES = {"pretokenize": (*_PRETOKENIZE_ONLY, "precompute", "preprocess", "pre_process", "cache", "cache_items",
                             "cache_dataset"),
             "cache": _WHOLE_ITEM}


def _caches(option: Option) -> bool:
    """A switch named for caching whole items (--precompute, --cache), not for tokenizing only."""
    return not any(n.startswith(w) for n in option.names() for w in _PRETOKENIZE_ONLY)


def _precompute_switch(cli: ScriptCli, kind: Any) -> Option | None:
    """The script's on/off flag (``store_true``) that pre-computes the items, when exactly one is
    named so and it is off in this run; None otherwise (the library's values stay the fix)."""
    names = _SWITCHES.get(kind) if isinstance(kind, str) else None
    if not names:
        return None
    found = [o for o in cli.options if not o.takes_value and o.const is True and o.value in (False, None)
             and any(n == w or n.startswith(w) for n in o.names() for w in names)]
    return found[0] if len(found) == 1 else None


def _option_for(cli: ScriptCli, key: str) -> Option | None:
    """The script's option for ``key``: same name first, else a single alias (given ones preferred)."""
    k = _norm(key)
    exact = [o for o in cli.options if k in o.names()]
    if exact:
        return exact[0]
    aliases = knobs.aliases(k)
    if not aliases:
        return None
    found = [o for o in cli.options if o.names() & aliases]
    if len(found) > 1:
        found = [o for o in found if _given(cli, o) is not None]
    return found[0] if len(found) == 1 else None


def _current(a: Analysis, p: ProcessView | None, finding: Finding, key: str) -> Any:
    """The value the run used for ``key``, where the recording says it."""
    if f"current_{key}" in finding.data:
        return finding.data[f"current_{key}"]
    if key in knobs.PROPORTIONAL:
        return finding.data.get(key)  # what each eval ran, measured
    names = names_for(p)
    if names.is_trainer and key in names.args:
        return names.args[key]
    if names.loader and key in ("num_workers", "batch_size", "prefetch_factor"):
        return names.loader.get(key)
    if key == "max_length":
        return a.padding().get("max_length")  # the width rows were padded to
    return None


def _agrees(script_value: Any, current: Any, approximate: bool) -> bool:
    """False when the option evidently holds another value than the knob the fix changes."""
    if script_value is None or current is None:
        return True
    if _number(script_value) and _number(current):
        if approximate:
            return bool(abs(script_value - current) <= max(1.0, 0.25 * abs(current)))
        return float(script_value) == float(current)
    return str(script_value) == str(current)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_number(a) and _number(b) and float(a) == float(b))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _given(cli: ScriptCli, option: Option) -> str | None:
    """The flag as the user spelled it on the command line, if they did."""
    for tok in reversed(cli.args[1:]):
        name = tok.partition("=")[0]
        if name in option.flags:
            return name
    return None


def _flag(cli: ScriptCli, option: Option) -> str:
    given = _given(cli, option)
    if given:
        return given
    longs = [f for f in option.flags if f.startswith("--")] or option.flags
    return next((f for f in longs if _norm(f) == _norm(option.dest)), longs[0])


def _text(cli: ScriptCli, option: Option, value: Any) -> str:
    if cli.style == "globals" and isinstance(option.default, float) and _number(value):
        return repr(float(value))  # the configurator insists on the default's type
    return str(value)


def _uses_equals(cli: ScriptCli, option: Option) -> bool:
    return cli.style == "globals" or any(
        tok.partition("=")[0] in option.flags and "=" in tok for tok in cli.args[1:])


def _spell(cli: ScriptCli, option: Option, value: Any) -> str | None:
    """``--save_steps 500`` (or ``--eval_iters=10``); None when the flag cannot say ``value``."""
    flag = _flag(cli, option)
    if not option.takes_value:
        return flag if _same(value, option.const) else None
    if isinstance(value, (list, dict)) or isinstance(option.value, list):
        return None
    return f"{flag}={_text(cli, option, value)}" if _uses_equals(cli, option) else f"{flag} {_text(cli, option, value)}"


def _was(cli: ScriptCli, option: Option) -> str:
    value = "unset" if option.value is None else _show(option.value)
    return str(value) if _given(cli, option) else f"its default ({value})"


def _show(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def edit_args(cli: ScriptCli, changes: list[_Change]) -> list[str]:
    """The script and its arguments with each change made where the flag is, else appended."""
    out = list(cli.args)
    for change in changes:
        opt, flag = change.option, _flag(cli, change.option)
        text = _text(cli, opt, change.value)
        found = False
        i = 1
        while i < len(out):
            name, eq, _ = out[i].partition("=")
            if name not in opt.flags:
                i += 1
                continue
            found = True
            if not opt.takes_value:
                if _same(change.value, opt.const):
                    i += 1
                else:
                    del out[i]
                continue
            if eq:
                out[i] = f"{name}={text}"
            elif i + 1 < len(out) and not _is_flag(out[i + 1]):
                out[i + 1] = text
            else:
                out.insert(i + 1, text)
            i += 2
        if not found and (opt.takes_value or _same(change.value, opt.const)):
            add = [flag] if not opt.takes_value else (
                [f"{flag}={text}"] if _uses_equals(cli, opt) else [flag, text])
            at = out.index("--") if "--" in out[1:] else len(out)
            out[at:at] = add
    return out


def _is_flag(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def _norm(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()
