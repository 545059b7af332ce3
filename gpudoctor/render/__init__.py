"""Renderers: :class:`~gpudoctor.core.schema.Report` -> ``report.json`` / ``report.html`` / ``report.md``.

Each renderer is a pure function of the typed report (built by ``build_report``, or a saved
``report.json`` validated on load), so a live run and a saved one render the same. Renderer modules are imported on demand to
keep the CLI fast.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.render.base import Renderer

if TYPE_CHECKING:
    from gpudoctor.core.schema import Report

__all__ = ["Renderer", "renderer_for", "write_all", "SUPPORTED_EXTENSIONS"]

_RENDERERS = {
    "json": "gpudoctor.render.json_renderer:JsonRenderer",
    "html": "gpudoctor.render.html:HtmlRenderer",
    "md": "gpudoctor.render.markdown:MarkdownRenderer",
}
_ALIASES = {"htm": "html", "markdown": "md"}
SUPPORTED_EXTENSIONS = tuple(f".{ext}" for ext in _RENDERERS)


def _extension(path_or_ext: str | Path) -> str:
    text = str(path_or_ext)
    suffix = Path(text).suffix if Path(text).suffix else text
    ext = suffix.lstrip(".").lower()
    return _ALIASES.get(ext, ext)


def renderer_for(path_or_ext: str | Path) -> Renderer:
    """The renderer for an output path (``out/report.html``) or extension (``.md``)."""
    ext = _extension(path_or_ext)
    target = _RENDERERS.get(ext)
    if target is None:
        raise UserError(
            f"cannot render to {str(path_or_ext)!r}: "
            f"use an output ending in {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    module_name, class_name = target.split(":")
    renderer: Renderer = getattr(importlib.import_module(module_name), class_name)()
    return renderer


def write_all(report: Report, folder: str | Path) -> list[Path]:
    """Write ``report.json``, ``report.html`` and ``report.md`` into ``folder``, 0600.

    The folder may be someone else's (``gpudoctor report FOLDER``): it is opened once and each
    file replaced by rename through that descriptor, so a planted ``report.md -> ~/.bashrc``
    is replaced, never written through (:func:`gpudoctor.common.safefs.replace_file`).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = {f"report.{r.output_file_extension}": r.render(report) for r in map(renderer_for, _RENDERERS)}
    fd = safefs.open_dir(folder)
    try:
        for name, text in texts.items():
            safefs.replace_file(name, text, dir_fd=fd)
    finally:
        os.close(fd)
    return [folder / name for name in texts]
