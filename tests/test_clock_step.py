"""A wall clock stepped mid-run (NTP, a resumed VM) leaves the collectives' spans among their steps.

The communication hooks time a collective on ``perf_counter`` and wrote its start on the wall clock
through an offset read once; a DDP test here lost all its communication (0.0 against 0.17 of the
wall) when this VM's clock stepped 18 s during it: every all-reduce landed 18 s before the steps
around it, outside the training's window.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, cli_env


def test_spans_written_after_a_clock_step_stay_between_their_steps(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "clock_step_collectives.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=cli_env({"GPUDOCTOR_PROFILE_WINDOW": "off"}))
    assert done.returncode == 0, done.stderr[-2000:]
    (events,) = (tmp_path / "events").glob("*.jsonl")
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    steps = sorted(r["t"] for r in rows if r["k"] == "step")
    spans = sorted(r["t0"] for r in rows if r["k"] == "span" and r.get("c") == "communication")
    assert len(steps) == 6 and len(spans) == 6  # one all-reduce a step, each a span of its own
    assert steps[3] - steps[2] > 99  # the clock's step, as the other events saw it
    for i, t0 in enumerate(spans):  # each all-reduce ends its step's work, 50 ms before the step
        assert steps[i] - 1.0 < t0 < steps[i], (i, t0, steps)
