"""gpudoctor.load(PATH): a run's tables agree with its report, round trip.

The real run is the heavy_checkpoints probe under ``gpudoctor run`` (shared with test_probes):
32 steps, a torch.save after each. Its step table must add up to the report's breakdown
seconds, and its events and samples to what the run folder holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import gpudoctor
from gpudoctor.common.errors import UserError
from gpudoctor.tables import COLUMNS, TABLES
from tests.recording_builder import RecordingBuilder

SLICES = ("startup", "data_wait", "compute", "checkpoint", "eval", "other")


@pytest.fixture(scope="module")
def probe(probe_run):
    return probe_run("heavy_checkpoints")


@pytest.fixture(scope="module")
def run(probe) -> gpudoctor.RunTables:
    return gpudoctor.load(probe.folder)


def test_every_table_has_its_typed_columns(run) -> None:
    for name in TABLES:
        df = getattr(run, name)
        assert isinstance(df, pd.DataFrame)
        assert {c: str(t) for c, t in df.dtypes.items()} == {c: str(pd.Series([], dtype=t).dtype)
                                                             for c, t in COLUMNS[name].items()}
        assert set(df["run"]) == {run.name}


def test_breakdown_table_is_the_reports_breakdown_in_seconds(run, probe) -> None:
    (row,) = run.breakdown.itertuples()
    report = probe.report
    assert row.wall_s == pytest.approx(report["run"]["duration_s"], abs=1e-3)
    for key in SLICES:
        assert round(getattr(row, f"{key}_s") / row.wall_s, 4) == pytest.approx(report["breakdown"][key], abs=1e-4)
    assert sum(getattr(row, f"{k}_s") for k in SLICES) == pytest.approx(row.wall_s)


def test_steps_add_up_to_the_breakdown_over_the_time_they_cover(run, probe) -> None:
    steps, (bd,) = run.steps, run.breakdown.itertuples()
    assert len(steps) == probe.report["steps"]["count"] == probe.truth["steps"]
    assert list(steps["step"]) == list(range(1, len(steps) + 1))
    assert steps["start_s"].iloc[0] == pytest.approx(bd.first_step_s)
    assert steps["end_s"].iloc[-1] == pytest.approx(bd.last_step_s)
    assert steps["duration_s"].sum() == pytest.approx(bd.last_step_s - bd.first_step_s)
    parts = steps[["data_wait_s", "compute_s", "checkpoint_s", "eval_s"]].sum(axis=1)
    assert (parts - steps["duration_s"]).abs().max() < 1e-9
    # what the steps do not cover: spans after the last step (the final save); before the first
    # there is only startup. The events table says which, independently of the step table.
    ev = run.events
    after = ev[ev["start_s"] >= bd.last_step_s].groupby("category")["duration_s"].sum()
    assert after.get("data_wait", 0.0) == 0.0  # the loop stops at its step count: no last empty fetch
    for key in ("data_wait", "checkpoint", "eval"):
        in_steps = steps[f"{key}_s"].sum()
        assert in_steps + after.get(key, 0.0) == pytest.approx(getattr(bd, f"{key}_s"), abs=1e-6)
        share, wall = probe.report["breakdown"][key], probe.report["run"]["duration_s"]
        # the report holds the share to 4 decimals and the wall to 3: half a unit of each, no more
        assert in_steps + after.get(key, 0.0) == pytest.approx(share * wall, abs=0.5e-4 * wall + 0.5e-3 * share + 1e-6)
    assert steps["compute_s"].sum() == pytest.approx(bd.compute_s, abs=1e-6)
    assert steps["checkpoint_s"].gt(0).sum() >= len(steps) - 1  # a save inside every step but the first


def test_events_and_samples_count_what_the_run_folder_holds(run, probe) -> None:
    ev = run.events
    assert (ev["category"] == "checkpoint").sum() == probe.truth["checkpoints"]
    assert (ev["category"] == "data_wait").sum() == probe.truth["steps"]
    assert set(ev["name"][ev["category"] == "checkpoint"]) == {"torch.save"}
    assert set(ev["pid"]) == {probe.truth["pid"]} and set(ev["rank"]) == {0}
    assert (ev["end_s"] - ev["start_s"] - ev["duration_s"]).abs().max() < 1e-9
    host_lines = (probe.folder / "samples" / "host.jsonl").read_text().splitlines()
    assert (run.samples["source"] == "host").sum() == len(host_lines)
    assert run.samples["t_s"].is_monotonic_increasing
    first = json.loads(host_lines[0])
    start = json.loads((probe.folder / "meta.json").read_text())["start_time"]
    assert run.samples["t_s"].iloc[0] == pytest.approx(first["t"] - start)


def test_repr_html_shows_headline_and_breakdown_escaped(probe, tmp_path) -> None:
    report = dict(probe.report, verdict="<script>alert(1)</script> & more")
    report["run"] = dict(report["run"], command=["python", "<img src=x onerror=alert(1)>"])
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    html = gpudoctor.load(path)._repr_html_()
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in html
    assert "<td>data wait</td>" in html and "<td>checkpoint</td>" in html


def test_a_report_json_alone_gives_empty_tables_and_says_why(probe) -> None:
    run = gpudoctor.load(probe.folder / "report.json")
    assert run.report["verdict"] == probe.report["verdict"]
    for name in TABLES:
        df = getattr(run, name)
        assert df.empty and list(df.columns) == list(COLUMNS[name])
    assert len(run.notes) == 1 and "report.json only" in run.notes[0]


def test_two_ranks_each_get_their_steps(tmp_path: Path) -> None:
    b = RecordingBuilder(tmp_path / "ddp", cores=8, duration_s=60.0)
    for pid, rank, compute in ((301, 0, 0.30), (302, 1, 0.38)):
        rows = b.process(pid=pid, rank=rank)
        b.training_loop(rows, start_s=5.0, steps=40, compute_s=compute, wait_s=0.05, save_every=10, save_s=1.0)
    run = gpudoctor.load(b.write())
    assert run.steps.groupby("rank").size().to_dict() == {0: 40, 1: 40}
    assert run.breakdown["rank"].tolist() == [0, 1]
    for _rank, group in run.steps.groupby("rank"):
        assert group["data_wait_s"].sum() == pytest.approx(40 * 0.05)
        assert group["checkpoint_s"].sum() == pytest.approx(3 * 1.0)  # the 4th save is after the last step
    assert run.samples.empty and not run.notes


def test_bad_paths_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file or folder"):
        gpudoctor.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no recording or report.json"):
        gpudoctor.load(tmp_path / "empty")
