"""Write a sweep folder: ``sweep.json``, ``sweep.md``, ``sweep.html`` and ``best.yaml``
(the user's config with the winning change, ready for ``gpudoctor replay``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gpudoctor.render.sweep_page import to_html, to_markdown
from gpudoctor.sweep import points as pts
from gpudoctor.sweep.results import finalize, write_json


def write_outputs(doc: dict[str, Any], folder: Path) -> None:
    """Finalize and write every file; safe to call after each point."""
    folder.mkdir(parents=True, exist_ok=True)
    finalize(doc)
    _best_yaml(doc, folder)
    write_json(doc, folder)
    for name, text in (("sweep.md", to_markdown(doc)), ("sweep.html", to_html(doc))):
        tmp = folder / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)


def _best_yaml(doc: dict[str, Any], folder: Path) -> None:
    change, best = doc.get("change"), doc.get("best")
    config = Path(doc["config"])
    if not change or not best or not change.get("params") or not config.is_file():
        return
    path = folder / "best.yaml"
    header = f"# {config.name} with the change gpudoctor sweep measured fastest: {best['label']}\n"
    raw = pts.read_raw(config)
    path.write_text(
        header + pts.dump(pts.apply(raw, best["params"], config.parent)), encoding="utf-8"
    )
    target = doc.get("target")
    change["command"] = f"gpudoctor replay {shlex.quote(str(path))}" + (
        f" --target {shlex.quote(target)}" if target else ""
    )
