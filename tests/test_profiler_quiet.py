"""A torch.profiler window prints nothing into the training's own output (issue #28, part 7).

Kineto logs ``USDT:… profiler_start`` / ``profiler_stop`` on stderr at every window; the
training's output is the user's, so a window starts with kineto's level above USDT.
"""

from __future__ import annotations

import json
import sys

from tests.conftest import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "scripts" / "tiny_loop.py")


def test_a_profiler_window_writes_no_usdt_lines_into_the_training_output(tmp_path):
    folder = tmp_path / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable, SCRIPT, "--seconds", "2",
                   env={"GPUDOCTOR_PROFILE_WINDOW": "5:3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    windows = [json.loads(line) for path in (folder / "events").glob("*.jsonl")
               for line in path.read_text().splitlines() if '"k":"profiler"' in line]
    assert len(windows) == 1 and windows[0]["steps"] == 3  # the window ran
    assert "USDT" not in proc.stdout and "USDT" not in proc.stderr
    assert "profiler_start" not in proc.stderr and "profiler_stop" not in proc.stderr
