"""A wall clock stepped mid-run (NTP, a resumed VM): the collectives' spans stay among their steps,
and the recording's times are taken back by the step.

The communication hooks time a collective on ``perf_counter`` and wrote its start on the wall clock
through an offset read once; a DDP test here lost all its communication (0.0 against 0.17 of the
wall) when this VM's clock stepped 18 s during it: every all-reduce landed 18 s before the steps
around it, outside the training's window. And every time written after a step sat that much later:
a 10.7 s training read as 33.2 s of wall, 80% of it startup.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.analysis import analyze
from gpudoctor.recording.clock import from_rows
from gpudoctor.recording.store import load_recording
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


def test_a_clock_stepped_during_a_run_is_taken_out_of_its_recording(tmp_path: Path) -> None:
    """The machine's wall clock 60 s forward 5 s into ``gpudoctor run`` (the doctor and the training
    stepped at one monotonic moment): the report's wall, startup and steps are the training's own
    (before: 79.0 s of wall, 84% startup, for an 18 s life), and a note says what was taken out. On a
    busy host the idle-priority samplers may write no row before the step: the doctor's own readings
    of both clocks at the start and the end still find it."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "clock_stepped_run.py"), "60", "5",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=180, env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    truth = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"life_s"')))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [n for n in report["notes"] if n.startswith("The wall clock was stepped 60.0 s forward at ")]
    assert truth["life_s"] <= report["run"]["duration_s"] < truth["life_s"] + 4  # the doctor's own start and end
    assert report["steps"]["first_step_at_s"] == pytest.approx(truth["startup_s"], abs=1.5)
    rec = load_recording(tmp_path / "run")
    assert len(rec.clock.after) == 1 and rec.clock.shift[0] == pytest.approx(60, abs=0.5)
    assert [r["m"] for r in rec.meta["clock"]] == sorted(r["m"] for r in rec.meta["clock"])
    times = sorted(analyze(rec).primary.step_times)  # type: ignore[union-attr]
    assert len(times) == 80 and max(b - a for a, b in zip(times, times[1:], strict=False)) < 2.0
    assert times[-1] - times[0] == pytest.approx(truth["training_s"], abs=1.0)


def test_steps_a_row_gap_cannot_separate_are_said_not_undone() -> None:
    """Forward by less than the rows' gap, or backward: the times written around it overlap those
    before it, so they stand as recorded and a note says so; a late tick is no step."""
    rows = [{"t": 100.0, "m": 10.0}, {"t": 101.0, "m": 11.0}, {"t": 104.5, "m": 14.0},  # 3 s apart: a late tick
            {"t": 105.5, "m": 15.0}, {"t": 99.0, "m": 16.0},  # 7.5 s back
            {"t": 100.0, "m": 17.0}, {"t": 120.0, "m": 28.0}]  # 9 s forward over an 11 s gap
    steps = from_rows(rows)
    assert not steps and steps.fix(130.0) == 130.0
    assert [n.split(" at ")[0] for n in steps.notes] == ["The wall clock was stepped 7.5 s back",
                                                         "The wall clock was stepped 9.0 s forward"]
    two = from_rows([{"t": 0.0, "m": 0.0}, {"t": 20.5, "m": 0.5}, {"t": 21.0, "m": 1.0}, {"t": 51.5, "m": 1.5}])
    assert two.shift == (20.0, 50.0)
    assert [two.fix(t) for t in (0.4, 20.6, 21.0, 51.4, 51.5)] == pytest.approx([0.4, 0.6, 1.0, 1.4, 1.5])


def test_forged_readings_neither_raise_nor_flood_the_notes() -> None:
    """A run folder may come from anyone: readings past any clock's range, and a thousand steps."""
    odd = [{"t": 100.0, "m": 1e300}, {"t": 1e17, "m": 2e300}, {"t": 1e300, "m": 5.0}, {"t": 100.0, "m": float("nan")}]
    assert not from_rows(odd)
    absurd = from_rows([{"t": 0.0, "m": 1.0}, {"t": 1e300, "m": 2.0}])
    assert absurd and absurd.notes[0].startswith("The wall clock was stepped")
    many = [{"t": 100.0 * i + (0.0 if i % 2 else 50.0), "m": float(i)} for i in range(1000)]
    steps = from_rows(many)
    assert len(steps.notes) == 6 and steps.notes[-1].startswith("... and ")
