"""One history row: a report's figures and where it ran, taken once when the report is written.

The figures are the report's own, never recomputed: steps/s is 1 / the p50 step time (as
``gpudoctor diff`` reads it), waste is ``cost.wasted_fraction``, the top finding is the first
finding that is not ``info``. A figure the report does not have is None, shown as unavailable.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common.numbers import num
from gpudoctor.common.wording import command_text, gpus_text
from gpudoctor.core.schema import Report, breakdown_items
from gpudoctor.history.git import commit_of

SCRIPT_SUFFIXES = (".py", ".yaml", ".yml", ".sh")


@dataclass
class Entry:
    """A report in the history. ``time``: when it was indexed (Unix seconds); ``folder``: absolute."""

    folder: str
    time: float = field(default_factory=time.time)
    id: int | None = None
    name: str | None = None
    mode: str | None = None  # run, attach, try, replay ...: the report's run.mode
    status: str | None = None
    started_at: str | None = None
    command: str = ""
    script: str | None = None
    git_commit: str | None = None
    host: str | None = None
    gpu: str | None = None
    steps: int | None = None
    duration_s: float | None = None
    steps_per_s: float | None = None
    breakdown: dict[str, float | None] = field(default_factory=dict)
    waste: float | None = None  # the wasted share of wall time
    top_finding: str | None = None
    top_finding_waste: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def from_report(report: Report, folder: Path, *, name: str | None = None, cwd: Path | None = None,
                git: bool = True) -> Entry:
    """The history row of ``report``, written in ``folder``.

    ``cwd``: where the command ran, to find its script (made absolute when it exists there) and the
    script's git commit; ``git=False`` reads no commit (a report re-rendered later: the checkout
    may have moved on since the run).
    """
    run = report.get("run") or {}
    argv = [str(a) for a in run.get("command") or []]
    script = script_of(argv)
    where = cwd or Path.cwd()
    if script is not None and not os.path.isabs(script) and (where / script).exists():
        script = os.path.abspath(where / script)
    steps = report.get("steps") or {}
    p50 = num((steps.get("step_time_s") or {}).get("p50"))
    count = num(steps.get("count"))
    top = next((f for f in report.get("findings") or [] if f.get("severity") != "info"), None)
    return Entry(
        folder=os.path.abspath(folder),
        name=name,
        mode=run.get("mode"),
        status=run.get("status"),
        started_at=run.get("started_at"),
        command=command_text(argv),
        script=script,
        git_commit=(commit_of(Path(script) if script and os.path.exists(script) else where) if git else None),
        host=(run.get("host") or {}).get("hostname"),
        gpu=gpus_text(run),
        steps=int(count) if count is not None else None,
        duration_s=num(run.get("duration_s")),
        steps_per_s=1 / p50 if p50 else None,
        breakdown=dict(breakdown_items(report.get("breakdown"))),
        waste=num((report.get("cost") or {}).get("wasted_fraction")),
        top_finding=top["rule"] if top else None,
        top_finding_waste=num(top.get("waste_fraction")) if top else None,
    )


def script_of(argv: list[str]) -> str | None:
    """The script a command runs: its first ``.py`` (or config) argument, ``-m``'s module, else
    the program; ``gpudoctor replay CONFIG``'s config."""
    if len(argv) >= 3 and Path(argv[0]).name == "gpudoctor" and argv[1] == "replay":
        return argv[2]
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if i and word.endswith(SCRIPT_SUFFIXES) and not word.startswith("-"):
            return word
    return argv[0] if argv else None
