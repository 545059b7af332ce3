"""The terminal side of a sweep, on stderr: a progress bar with ETA, one line per
finished point, and the results table at the end. stdout stays free for ``--json``.
Every string shown goes through :func:`gpudoctor.common.termtext.terminal_text` (and is escaped
where rich would read it as markup): a trial's crash text is the training's.
"""

from __future__ import annotations

import sys
from typing import Any

from gpudoctor.common.termtext import terminal_text
from gpudoctor.render.progress import live_output
from gpudoctor.render.sweep_cells import cells, columns, line, visible


class Display:
    """Rich progress on stderr; no bar where :func:`~gpudoctor.render.progress.live_output` says
    none (no terminal, ``--quiet``, ``--json``, ``CI``), the lines and the table all the same."""

    def __init__(self, total: int, title: str, live: bool = True) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True, highlight=False)
        if not self.console.is_terminal:
            self.console.width = 160  # a log file: do not squeeze the table to 80 columns
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=not live_output(sys.stderr, quiet=not live),
        )
        self.task = self.progress.add_task(title, total=max(total, 0))

    def __enter__(self) -> Display:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def running(self, label: str, attempt: int) -> None:
        from rich.markup import escape

        again = f" (repeat {attempt}: noisy)" if attempt else ""
        self.progress.update(self.task, description=escape(terminal_text(f"trial {label}{again}")))

    def point(self, point: dict[str, Any], counted: bool) -> None:
        """Print a finished point above the bar; ``counted`` points advance it."""
        from rich.text import Text

        color = {"ok": "green", "skipped": "dim"}.get(point["status"], "red")
        text = Text(f"{point['status']:>9} ", style=color)
        text.append(terminal_text(line(point) + (" (cached)" if point.get("cached") else "")))
        self.console.print(text, soft_wrap=True)
        if counted:
            self.progress.advance(self.task)

    def table(self, doc: dict[str, Any]) -> None:
        from rich.markup import escape
        from rich.table import Table

        shown = visible(doc["points"])
        table = Table(title="gpudoctor sweep", title_justify="left")
        for i in shown:
            name, right = columns()[i]
            table.add_column(name, justify="right" if right else "left", overflow="fold")
        best = (doc.get("best") or {}).get("index")
        for point in doc["points"]:
            row = cells(point)
            style = "bold green" if point["index"] == best else None
            table.add_row(  # plain strings are rich markup: escaped, after the one sanitiser
                *(escape(terminal_text(row[i])) for i in shown), style=style if point["status"] == "ok" else "dim"
            )
        self.console.print(table)
