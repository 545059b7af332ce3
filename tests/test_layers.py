"""The floor plan: each package lives on a floor, and a floor imports only the floors below it.

``test_import_cycles.py`` finds cycles; this finds the first step of one, an import that points
up, before the step back down is written. Module-level, function-level and ``if TYPE_CHECKING:``
imports count alike: a lazy import hides the tie from Python, not from the next reader.
Packages on one floor know nothing of each other (``render`` never reads ``report/build``), so
each floor can be read, tested and changed with only the floors below it in mind.

From the bottom (``docs/layout.md`` draws the same plan):

- ``common``: stdlib helpers every floor may use (safe files, errors, words, the GPU table).
- ``core``: the two contracts, typed once: the events file (``events``) and the report (``schema``).
- ``recording`` (the run folder on disk), ``hooks`` (inside the patient; they write events) and
  ``history`` (the index of every report, on disk).
- ``processes``: the patient's processes and the doctor's own children (pids, tree, priority).
- ``samplers``: NVML and psutil, on their threads.
- ``analysis``: pure functions over a recording; the workload and loop models.
- ``rules``: findings and fixes, from the analysis.
- ``report`` (built, checked, merged, compared), ``render`` (worded) and ``trackers`` (sent).
- ``tables``: a run as pandas tables and their export.
- ``pipeline``: run folder -> report -> pages, for every mode.
- ``launch``: ``run``'s engine (start a command under the recorder; time the model at other widths),
  and ``live`` (the panel and progress lines while a mode runs).
- the modes: ``attach``, ``replay``, ``tryfix``, ``integrations`` (the public callbacks).
- ``sweep``: many replays (or trials) at once.
- ``commands`` (one module per command), then ``cli`` (which lists them), then the entry points:
  ``__main__``, the package root (the public API) and ``_inject``'s ``sitecustomize``.

When this fails: move what both sides need down to a floor both may use (a constant to the
floor of its one model, a type to ``core``, a helper to ``common``), or hand the value in from
above; do not hide the import in a function.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tests.test_import_cycles import PACKAGE, _imports, _modules, _targets

ROOT = "gpudoctor"  # the package's own __init__ (the public API): named alone, not as a prefix

# Bottom first. A module belongs to the longest prefix that names it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("gpudoctor.common", "gpudoctor._version"),
    ("gpudoctor.core",),
    ("gpudoctor.recording", "gpudoctor.hooks", "gpudoctor.history"),
    ("gpudoctor.processes",),
    ("gpudoctor.samplers",),
    ("gpudoctor.analysis",),
    ("gpudoctor.rules",),
    ("gpudoctor.report", "gpudoctor.render", "gpudoctor.trackers"),
    ("gpudoctor.tables",),
    ("gpudoctor.pipeline",),
    ("gpudoctor.launch", "gpudoctor.live"),
    ("gpudoctor.attach", "gpudoctor.replay", "gpudoctor.tryfix", "gpudoctor.integrations"),
    ("gpudoctor.sweep",),
    ("gpudoctor.commands",),
    ("gpudoctor.cli",),
    ("gpudoctor.__main__", "gpudoctor._inject", ROOT),
)


def _room(module: str) -> tuple[int, str]:
    """(floor, the prefix that placed it): the longest prefix of ``FLOORS`` naming ``module``."""
    best: tuple[int, str] | None = None
    for floor, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            named = module == prefix or (prefix != ROOT and module.startswith(prefix + "."))
            if named and (best is None or len(prefix) > len(best[1])):
                best = (floor, prefix)
    assert best is not None, f"{module} is on no floor: add its package to FLOORS (and to docs/layout.md)"
    return best


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the package module it runs
    where: str  # path:line of the statement


def _package_imports() -> list[Import]:
    mods = _modules()
    out = []
    for module, path in mods.items():
        for node in _imports(ast.parse(path.read_text())):
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            out.extend(Import(module, t, where) for t in _targets(module, node, mods) if t != module)
    return out


def _wrong_way(imports: list[Import]) -> list[str]:
    """Each import that points up a floor, or sideways into another package of its floor, worded
    with the way out."""
    wrong = []
    for imp in imports:
        (low, room), (high, other) = _room(imp.source), _room(imp.target)
        if high < low or room == other:
            continue
        way = "up" if high > low else "sideways"
        wrong.append(f"{imp.where}: {imp.source} imports {imp.target}, {way} from {room} (floor {low}) to "
                     f"{other} (floor {high}): move what both need to a floor below both "
                     f"(common/, core/, the model's own module), or hand it in from above")
    return sorted(wrong)


def test_every_import_points_down_a_floor():
    assert _wrong_way(_package_imports()) == []


def test_every_module_is_on_a_floor():
    for module in _modules():
        _room(module)


def test_an_upward_import_is_named_with_its_way_out():
    imports = [Import("gpudoctor.analysis.gpu_timeline", "gpudoctor.replay.costmodel", "a.py:3"),
               Import("gpudoctor.render.html", "gpudoctor.report.build", "b.py:5"),
               Import("gpudoctor.rules.gpu", "gpudoctor.analysis.model", "c.py:7")]
    wrong = _wrong_way(imports)
    assert len(wrong) == 2
    assert wrong[0].startswith("a.py:3: gpudoctor.analysis.gpu_timeline imports gpudoctor.replay.costmodel, up from "
                               "gpudoctor.analysis (floor 5) to gpudoctor.replay (floor 11): move what both need")
    assert "sideways from gpudoctor.render" in wrong[1]
