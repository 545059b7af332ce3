"""attach's live line: the figures it shows are said with the moment they were computed.

The breakdown is recomputed at most every few seconds (its cost is the patient's), so a plain
line printed between two analyses repeats the last figures; on a 1 step/s loop it said
"(10 steps)" at 11 s and again at 21 s, as if the training had stalled (issue #38).
"""

from __future__ import annotations

import time

from gpudoctor.attach.live import LiveState, plain_line


def test_a_repeated_figure_says_when_it_was_computed() -> None:
    state = LiveState(pid=42, source="in-process hooks", duration_s=None, started=0.0)
    state.breakdown, state.steps, state.analysed_s = {"compute": 0.9, "data_wait": 0.1}, 10, 11.0
    state.started = time.time() - 11.2  # analysed just now: no age to say
    assert plain_line(state).endswith("(10 steps)")
    state.started -= 10.0  # 21 s attached, the figures still those of 11 s
    line = plain_line(state)
    assert line.startswith("21 s attached to pid 42") and line.endswith("(10 steps by 11 s)")
    state.sampled = True
    assert plain_line(state).endswith("(from stack samples by 11 s)")
