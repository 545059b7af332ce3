"""Record the script's own command-line options, so a fix can name the flag the script takes.

Two styles are seen: a parser (``argparse.ArgumentParser.parse_args``/``parse_known_args``,
``transformers.HfArgumentParser`` through them), hooked when it parses; and nanoGPT's
configurator, plain module globals that ``exec(open('configurator.py').read())`` (or a
function setting ``globals()[key]``) overrides from ``--key=value``, read from the script's
source (its literal assignments) and ``sys.argv`` when the hooks go in. Each option keeps its name, flags, default and value,
redacted like everything else. Stdlib only: this runs inside the patient.
"""

from __future__ import annotations

import ast
import math
import os
import sys
import threading
import time
from enum import Enum
from types import ModuleType, SimpleNamespace
from typing import Any

from gpudoctor.common.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_mapping,
    redact_value,
)
from gpudoctor.core.events import CliEvent, CliOption
from gpudoctor.hooks import patch
from gpudoctor.hooks.guard import guarded
from gpudoctor.hooks.writer import EventWriter

MAX_OPTIONS = 1000
MAX_TEXT = 300
MAX_ITEMS = 20
MAX_SOURCE_BYTES = 1 << 20  # a script larger than this is not read for its globals

_depth = threading.local()


def install_argparse(writer: EventWriter, mod: ModuleType) -> None:
    """Hook ``ArgumentParser.parse_known_args``: ``parse_args`` and HfArgumentParser go through it."""
    parser_cls = getattr(mod, "ArgumentParser", None)
    if parser_cls is None:
        return

    def make(fn: Any) -> Any:
        def parse_known_args(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer = _begin()
            try:
                result = fn(self, *args, **kwargs)
            except BaseException as exc:
                patch.hide_wrapper(exc)
                raise
            finally:
                _end()
            if outer:  # a subparser's or an intermixed parse's inner call is part of this one
                _record_parse(writer, self, args[0] if args else kwargs.get("args"), result)
            return result

        return parse_known_args

    patch.replace(parser_cls, "parse_known_args", make)


@guarded("command-line parser")
def _begin() -> bool:
    d = getattr(_depth, "n", 0)
    _depth.n = d + 1
    return d == 0


@guarded("command-line parser")
def _end() -> None:
    _depth.n = max(getattr(_depth, "n", 1) - 1, 0)


@guarded("command-line parser")
def _record_parse(writer: EventWriter, parser: Any, args: Any, result: Any) -> None:
    namespace = result[0] if isinstance(result, tuple) and result else None
    writer.emit(parser_event(parser, namespace, args))


def parser_event(parser: Any, namespace: Any, args: Any = None) -> CliEvent:
    """One ``cli`` event for a parse: every option's flags, default and the value it got."""
    argv = list(sys.argv[1:])
    explicit = list(args) if isinstance(args, (list, tuple)) else None
    from_argv = explicit is None or explicit == argv or (bool(argv) and explicit[-len(argv):] == argv)
    options: list[CliOption] = []
    for action in list(getattr(parser, "_actions", []))[:MAX_OPTIONS]:
        entry = _option(action, namespace)
        if entry is not None:
            options.append(entry)
    return {
        "k": "cli",
        "t": time.time(),
        "style": "argparse",
        "parser": type(parser).__name__,
        "from_argv": from_argv,
        "args": redact_argv([str(a) for a in explicit]) if explicit is not None and not from_argv else None,
        "options": options,
    }


def _option(action: Any, namespace: Any) -> CliOption | None:
    dest = getattr(action, "dest", None)
    kind = type(action).__name__
    if not isinstance(dest, str) or dest == "==SUPPRESS==" or kind in ("_HelpAction", "_VersionAction",
                                                                       "_SubParsersAction"):
        return None
    flags = [str(f) for f in getattr(action, "option_strings", []) or []]
    secret = is_secret_name(dest) or any(is_secret_name(f) for f in flags)
    value = getattr(namespace, dest, None) if namespace is not None else None
    nargs = getattr(action, "nargs", None)
    out: CliOption = {
        "dest": redact_value(dest),
        "flags": [redact_value(f) for f in flags],
        "default": _plain(getattr(action, "default", None), secret),
        "value": _plain(value, secret),
        "takes_value": nargs != 0,
        "const": _plain(getattr(action, "const", None), secret) if nargs == 0 else None,
    }
    choices = None if secret else _choices(getattr(action, "choices", None))
    if choices is not None:
        out["choices"] = choices
    return out


def _choices(choices: Any) -> list[str | int] | None:
    """The words an option accepts (``choices=["max_length", "longest"]``): a fix may set it only
    to one of them. A short list of plain words or numbers; anything else is left unsaid."""
    if not isinstance(choices, (list, tuple)) or not 0 < len(choices) <= MAX_ITEMS:
        return None
    if not all(isinstance(c, (str, int)) and not isinstance(c, bool) for c in choices):
        return None
    return [redact_value(c[:MAX_TEXT]) if isinstance(c, str) else c for c in choices]


def _plain(value: Any, secret: bool = False, depth: int = 0) -> Any:
    """A JSON value that says what the option holds: scalars kept, the rest as short text."""
    if secret and value not in (None, False, ""):
        return REDACTED
    if isinstance(value, Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return redact_value(value[:MAX_TEXT])
    if isinstance(value, (list, tuple)) and depth == 0:
        return [_plain(v, False, 1) for v in list(value)[:MAX_ITEMS]]
    try:
        text = str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return redact_mapping(text[:MAX_TEXT])


@guarded("command-line parser")
def record_existing_parser(writer: EventWriter) -> None:
    """Attach comes after the parse: a parser and its Namespace kept as ``__main__`` globals."""
    argparse = sys.modules.get("argparse")
    main = sys.modules.get("__main__")
    if argparse is None or main is None:
        return
    found = list(vars(main).values())
    parsers = [v for v in found if isinstance(v, argparse.ArgumentParser)]
    spaces = [v for v in found if isinstance(v, argparse.Namespace)]
    if len(parsers) == 1 and len(spaces) == 1:  # without its values, a parser says too little
        writer.emit(parser_event(parsers[0], spaces[0]))
        return
    # A parser local to main() (run_clm's HfArgumentParser): still alive as an object. Its values
    # come from sys.argv, read here without calling the parser (no type hooks, no side effects).
    parser = _parser_of_argv(argparse, sys.argv[1:])
    if parser is not None:
        writer.emit(parser_event(parser, _argv_values(parser, sys.argv[1:])))


def _parser_of_argv(argparse: Any, argv: list[str]) -> Any:
    """The live parser whose flags the command line uses most (at least one), else None."""
    import gc

    given = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if not given:
        return None
    kinds, todo = {argparse.ArgumentParser}, [argparse.ArgumentParser]
    while todo:  # its subclasses (HfArgumentParser): a set lookup on type(obj), no isinstance, which
        for sub in todo.pop().__subclasses__():  # reads __class__ and makes some proxies warn
            if sub not in kinds:
                kinds.add(sub)
                todo.append(sub)
    best, score = None, 0
    for obj in gc.get_objects():
        if type(obj) in kinds:
            flags = {f for action in obj._actions for f in action.option_strings}
            hits = len(given & flags)
            if hits > score:
                best, score = obj, hits
    return best


def _argv_values(parser: Any, argv: list[str]) -> Any:
    """A namespace of what ``argv`` gave each option (else its default), as the parser would."""
    values: dict[str, Any] = {}
    for action in parser._actions:
        values[action.dest] = action.default
        for i, arg in enumerate(argv):
            flag, eq, text = arg.partition("=")
            if flag not in action.option_strings:
                continue
            if action.nargs == 0:
                values[action.dest] = action.const
            elif eq or i + 1 < len(argv):
                raw = text if eq else argv[i + 1]
                kind = action.type if action.type in (int, float, str) else None
                try:
                    values[action.dest] = kind(raw) if kind is not None else raw
                except ValueError:
                    values[action.dest] = raw
    return SimpleNamespace(**values)


@guarded("script globals")
def record_script_globals(writer: EventWriter) -> None:
    """nanoGPT's style: when the script execs a configurator, record its literal globals."""
    event = globals_event(sys.argv)
    if event is not None:
        writer.emit(event)


def globals_event(argv: list[str]) -> CliEvent | None:
    """A ``cli`` event of style ``globals`` for ``argv[0]``'s literal settings, or None.

    The settings are the top-level ``NAME = literal`` lines before the script's first
    top-level ``exec(...)`` (all of them when a function sets ``globals()[...]``); a bare
    argument is a config file the configurator execs, read the same way; ``--NAME=value``
    (or ``--NAME value``) overrides, in order, like nanoGPT's configurator.py.
    """
    script = argv[0] if argv else ""
    source = _read_source(script)
    if source is None or ("exec(" not in source and "globals()" not in source):
        return None
    settings = _configurable(source)
    if not settings:
        return None
    values = dict(settings)
    args = argv[1:]
    for i, arg in enumerate(args):
        key, eq, text = arg[2:].partition("=")
        if arg.startswith("--") and key in values:
            if eq or i + 1 < len(args):
                values[key] = _literal(text if eq else args[i + 1])
        elif not arg.startswith("-") and (source_text := _read_source(arg)) is not None:
            values.update({k: v for k, v in _assignments(source_text) if k in values})
    options: list[CliOption] = []
    for name, default in list(settings.items())[:MAX_OPTIONS]:
        secret = is_secret_name(name)
        options.append({"dest": name, "flags": [f"--{name}"], "default": _plain(default, secret),
                        "value": _plain(values[name], secret), "takes_value": True, "const": None})
    return {"k": "cli", "t": time.time(), "style": "globals", "parser": "configurator",
            "from_argv": True, "args": None, "options": options}


def _read_source(path: str) -> str | None:
    if not path.endswith(".py"):
        return None
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_SOURCE_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(MAX_SOURCE_BYTES)
    except OSError:
        return None


def _configurable(source: str) -> dict[str, Any]:
    """The literal globals a configurator can override; {} when nothing overrides them."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    settings: dict[str, Any] = {}
    for node in tree.body:
        if _is_exec(node):
            return settings
        settings.update(_assignment(node))
    return settings if any(_sets_globals(node) for node in ast.walk(tree)) else {}


def _sets_globals(node: ast.AST) -> bool:
    """``globals()[key] = value``, as a hand-written configurator does."""
    return (isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call)
        and isinstance(t.value.func, ast.Name) and t.value.func.id == "globals" for t in node.targets))


def _assignments(source: str) -> list[tuple[str, Any]]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [kv for node in tree.body for kv in _assignment(node).items()]


def _assignment(node: ast.stmt) -> dict[str, Any]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return {}
    if not isinstance(target, ast.Name) or target.id.startswith("_"):
        return {}
    try:
        literal = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return {}
    return {target.id: literal} if isinstance(literal, (bool, int, float, str)) else {}


def _is_exec(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "exec")


def _literal(text: str) -> Any:
    """What the configurator makes of a value: a Python literal, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
