"""torch.profiler windows: when they open, and that a CPU-only run pays for one only."""

from __future__ import annotations

import time

import torch

from gpudoctor.hooks.profiler_windows import MIN_STEPS, ProfilerWindows
from gpudoctor.hooks.writer import EventWriter


def _train(windows: ProfilerWindows, steps: int, model: torch.nn.Module) -> int:
    """``steps`` real optimizer-free steps; how many of them ran inside a window."""
    inside = 0
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        windows.on_step()
        inside += windows.open
    return inside


def test_a_cpu_only_run_gets_one_window_not_one_every_ten_minutes(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("GPUDOCTOR_PROFILE_WINDOW", raising=False)
    writer = EventWriter(tmp_path)
    windows = ProfilerWindows(writer)
    model = torch.nn.Linear(8, 1)
    assert _train(windows, MIN_STEPS + 5, model) == 0  # the first minute has not passed
    windows._last_p = time.perf_counter() - 3600  # an hour on: due
    assert _train(windows, 10, model) > 0 and not windows.open  # the window ran and closed
    windows._last_p = time.perf_counter() - 3600 * 24  # a day on: no GPU, so no second window
    assert _train(windows, 10, model) == 0
    writer.close(exiting=False)
    lines = (tmp_path / "events").glob("*.jsonl")
    windows_written = sum(text.count('"k":"profiler"') for text in (p.read_text() for p in lines))
    assert windows_written == 1
