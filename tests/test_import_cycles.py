"""No import cycles in the package: module-level and function-level imports alike.

A function-level import hides a cycle from Python, not from a reader: the layers
(recording -> analysis -> rules -> report -> render; hooks below integrations; commands on
top, imported by nothing) must stay one-way. ``if TYPE_CHECKING:`` imports count too: they
never run, but a type that needs the other module is the same two-way tie (a small ``Protocol``
is what breaks it).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpudoctor"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement: module level, function level and ``if TYPE_CHECKING:`` alike."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _targets(module: str, node: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> set[str]:
    """The package modules an import statement runs (a submodule if it names one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".")
            if mods[module].name != "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[: len(pkg) - node.level + 1]
            base = ".".join([*pkg, base] if base else pkg)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    return {n for n in names if n in mods}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {t for node in _imports(ast.parse(p.read_text())) for t in _targets(m, node, mods)} - {m}
            for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle():
    assert _cycles(_graph()) == []


def test_nothing_below_the_commands_imports_them():
    graph = _graph()
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if t.startswith("gpudoctor.commands") and not m.startswith(("gpudoctor.commands", "gpudoctor.cli")))
    assert upward == []


def _edges(graph: dict[str, set[str]], source: tuple[str, ...], target: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if m.startswith(source) and t.startswith(target))


# The modes: where a recording comes from and what is done with it (one each on the command line).
MODES = ("gpudoctor.attach", "gpudoctor.launch", "gpudoctor.replay", "gpudoctor.sweep",
         "gpudoctor.tryfix", "gpudoctor.report.diff", "gpudoctor.pipeline")


def test_renderers_know_no_mode():
    """A renderer words figures it is handed: it never reaches into a mode (nor a mode into it,
    for the diff: report/diff.py computes, render/ words)."""
    graph = _graph()
    assert _edges(graph, ("gpudoctor.render",), (*MODES, "gpudoctor.commands", "gpudoctor.cli")) == []
    assert _edges(graph, ("gpudoctor.report.diff",), ("gpudoctor.render",)) == []


def test_nothing_imports_the_command_line():
    assert _edges(_graph(), ("gpudoctor.",), ("gpudoctor.cli",)) == ["gpudoctor.__main__ -> gpudoctor.cli"]


def test_injected_hooks_know_no_mode_and_import_the_stdlib_only_beside_the_package():
    """The hooks run inside the patient's interpreter: they import no mode, no analysis, no render,
    and of the recording nothing: the event vocabulary they write is stdlib-only ``core/events.py``."""
    graph = _graph()
    banned = (*MODES, "gpudoctor.analysis", "gpudoctor.rules", "gpudoctor.render", "gpudoctor.report",
              "gpudoctor.samplers", "gpudoctor.commands", "gpudoctor.cli")
    assert _edges(graph, ("gpudoctor.hooks",), banned) == []
    assert _edges(graph, ("gpudoctor.hooks",), ("gpudoctor.recording",)) == []
    core = {t for t in _edges(graph, ("gpudoctor.hooks",), ("gpudoctor.core",))}
    assert {e.split(" -> ")[1] for e in core} <= {"gpudoctor.core.events"}
    events = ast.parse((PACKAGE / "core" / "events.py").read_text())
    assert [n for n in _imports(events) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gpudoctor")] == []


def test_analysis_imports_neither_render_nor_hooks():
    graph = _graph()
    assert _edges(graph, ("gpudoctor.analysis", "gpudoctor.rules"), ("gpudoctor.render", "gpudoctor.hooks")) == []


def test_the_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_hooks_load_only_the_event_vocabulary_of_the_recording():
    """Importing the hooks (as the patient does) loads ``core/events.py`` alone: not the report
    schema, the recording's store, its reader or orjson."""
    code = ("import sys, gpudoctor.hooks, gpudoctor.hooks.torch_hooks, gpudoctor.hooks.eval_regions; "
            "print(sorted(m for m in sys.modules if m.startswith(('gpudoctor.recording', 'gpudoctor.core', 'orjson'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert out.stdout.split("\n")[0] == "['gpudoctor.core', 'gpudoctor.core.events']"
