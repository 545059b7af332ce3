"""What adding the figures to one tracker run came to: a line for the report and the terminal."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.core.schema import TrackerStatus


@dataclass(frozen=True)
class Outcome:
    status: TrackerStatus  # "added", "skipped" (on purpose, with the reason) or "failed"
    target: str  # the run, as its tracker names it
    detail: str

    @classmethod
    def added(cls, target: str, detail: str) -> Outcome:
        return cls("added", target, detail)

    @classmethod
    def skipped(cls, target: str, why: str) -> Outcome:
        return cls("skipped", target, why)
