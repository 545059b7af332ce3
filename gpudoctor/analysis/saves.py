"""Saves counted once each, by kind: periodic checkpoints, the final save, side files.

A save is one outermost span (``save_pretrained`` calling ``torch.save`` is one). A
``torch.save`` of an object without tensors (``training_args.bin``, a config) is a
side file (``save_side`` spans): timed as saving, never a checkpoint. Saves that
start after the last step are the final save, unless the first of them falls on the
run's own save cadence (a Trainer with ``save_steps`` dividing ``max_steps`` saves a
checkpoint after its last step, then ``save_model()`` the final one).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from gpudoctor.analysis import timeline as tl
from gpudoctor.analysis.process import ProcessView
from gpudoctor.core import schema
from gpudoctor.core.events import SIDE_FILE  # the span category of a save without tensors


@dataclass
class Saves:
    checkpoints: list[tl.Interval]
    final: list[tl.Interval]
    side: list[tl.Interval]

    def to_dict(self) -> schema.Saves:
        """The report's ``saves`` section."""
        return {"checkpoints": len(self.checkpoints), "checkpoint_s": round(tl.total(self.checkpoints), 3),
                "final": len(self.final), "final_s": round(tl.total(self.final), 3),
                "side_files": len(self.side), "side_files_s": round(tl.total(self.side), 3)}


def split_saves(p: ProcessView) -> Saves:
    saves = tl.merge(p.spans.get("checkpoint", []))
    side = sorted(p.spans.get(SIDE_FILE, []))
    times = sorted(p.step_times)
    if not times or not saves:
        return Saves(saves, [], side)
    last = times[-1]
    during = [s for s in saves if s[0] < last]
    after = [s for s in saves if s[0] >= last]
    if not after:
        return Saves(saves, [], side)
    # Steps before each save since the previous one (the first: since the first step).
    ends = [times[0] - 1.0, *(b for _, b in during)]
    gaps = [bisect.bisect_right(times, s[0]) - bisect.bisect_right(times, e) for e, s in zip(ends, during, strict=False)]
    since = bisect.bisect_right(times, after[0][0]) - bisect.bisect_right(times, ends[-1])
    if gaps and since == round(statistics.median(gaps)):
        return Saves([*during, after[0]], after[1:], side)
    return Saves(during, after, side)
