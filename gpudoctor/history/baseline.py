"""A run held against an earlier one from the history: the figures ``check --baseline`` gates on.

``last`` is the newest earlier run of the same script (older than the run itself when it is
indexed); a number is a history id; anything else a ``--name``. The figures are computed here,
worded by the command: steps/s fell by a share of the baseline's, waste rose by points of wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import terminal_safe
from gpudoctor.history.entry import Entry
from gpudoctor.history.store import History

LAST = "last"


@dataclass(frozen=True)
class Comparison:
    """``slowdown``: 1 - now/before steps/s (negative: faster); ``waste_rise``: now - before wasted
    share of wall time. None where either run lacks the figure."""

    current: Entry
    baseline: Entry
    slowdown: float | None
    waste_rise: float | None

    def slower(self, bound: float) -> bool:
        return self.slowdown is not None and self.slowdown > bound

    def wastes_more(self, bound: float) -> bool:
        return self.waste_rise is not None and self.waste_rise > bound


def compare(current: Entry, baseline: Entry) -> Comparison:
    now, before = current.steps_per_s, baseline.steps_per_s
    slowdown = 1 - now / before if now is not None and before else None
    rise = current.waste - baseline.waste if current.waste is not None and baseline.waste is not None else None
    return Comparison(current, baseline, slowdown, rise)


def find_baseline(history: History, ref: str, current: Entry) -> Entry:
    """The entry ``ref`` names (``last``, an id, a name), never ``current``'s own; one line when none."""
    text = ref.strip().removeprefix("#")
    if text == LAST:
        indexed = history.of_folder(Path(current.folder), current.started_at)
        found = history.last_before(current.script, indexed.id if indexed else None, current.folder)
        if found is None:
            script = terminal_safe(current.script or "this command")
            raise UserError(f"no earlier run of {script} in the history {history.path}; record one first "
                            "('gpudoctor run -- ...'), or name a baseline: --baseline ID (see gpudoctor history)")
        return found
    found = history.get(int(text)) if text.isdigit() else history.named(ref)
    if found is None:
        raise UserError(f"no run {terminal_safe(ref)!r} in the history {history.path} (an id, a --name, or "
                        "'last'); list them with 'gpudoctor history'")
    if found.folder == current.folder and found.started_at == current.started_at:
        raise UserError(f"--baseline {terminal_safe(ref)} is the run being checked; name an earlier run "
                        "(see gpudoctor history)")
    return found
