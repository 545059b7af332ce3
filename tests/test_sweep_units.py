"""``gpudoctor sweep`` pieces that need no trial process: windows, grid, plan, climb, pages."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gpudoctor.common.errors import UserError
from gpudoctor.render.sweep_page import to_html, to_markdown
from gpudoctor.replay.config import load_config_text
from gpudoctor.sweep import adaptive
from gpudoctor.sweep.axes import ACCUM, BATCH, WORKERS, parse_axis, parse_grid
from gpudoctor.sweep.plan import build_plan, shard
from gpudoctor.sweep.points import Resolved
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.results import finalize, merge, new_doc, point_entry
from gpudoctor.sweep.runner import Runner
from gpudoctor.sweep.trial import TrialRun
from gpudoctor.sweep.windows import TrialEvents, combine, read_trial, steady_state

CONFIG = """
dataset: {kind: synthetic, count: 100}
training:
  per_device_train_batch_size: 8
  gradient_accumulation_steps: 2
  dataloader_num_workers: 0
  learning_rate: 1e-4
"""


def cfg():
    return load_config_text(CONFIG, "test.yaml")


T0 = 1.7e9  # epoch seconds, as the hooks write them


def event_lines(arrivals_t: list[float], rows: int = 8, wait_s: float = 0.01) -> list[dict]:
    """What the hooks write for these batch arrivals (seconds from T0)."""
    out: list[dict] = []
    for i, t in enumerate(arrivals_t):
        t += T0
        out.append({"k": "span", "c": "data_wait", "t0": t - wait_s, "dt": wait_s})
        out.append(
            {"k": "batch", "t": t, "tokens": rows * 10, "pad": rows * 2, "seq_len": 10,
             "lengths": [8] * rows}
        )  # fmt: skip
        if i % 2:
            out.append({"k": "step", "t": t + 0.001})
    return out


def load(lines: list[dict], tmp: Path, extra: str = "") -> TrialEvents:
    """The lines as a trial's events file, read back the way a trial's are (validator included)."""
    (tmp / "events").mkdir(exist_ok=True)
    text = "".join(json.dumps(e) + "\n" for e in lines) + extra
    (tmp / "events" / "1.jsonl").write_text(text)
    return read_trial(tmp, 1)


@pytest.fixture
def events(tmp_path: Path):
    return lambda arrivals_t, **kw: load(event_lines(arrivals_t, **kw), tmp_path)


def test_warmup_backlog_is_not_counted_as_throughput(events):
    # 20 batches drained from a prefetch queue in the first 0.2 s, then one batch every 0.1 s.
    burst = [0.01 * i for i in range(20)]
    steady = [0.2 + 0.1 * i for i in range(1, 61)]
    result = steady_state(
        events(burst + steady), 8, Protocol(warmup_s=1.0, window_s=1.5, windows=3)
    )
    assert result is not None and len(result["windows"]) == 3
    figures = combine([result], accumulation=2, batch_size=8)
    # 8 rows every 0.1 s; the burst would have read as 800 samples/s.
    assert figures["samples_per_s"] == pytest.approx(80.0, rel=0.02)
    assert figures["spread"] < 0.05
    assert figures["nonpad_tokens_per_s"] == pytest.approx(640.0, rel=0.02)
    assert figures["data_wait_share"] == pytest.approx(0.1, rel=0.05)
    assert figures["step_time_s"] == pytest.approx(0.2, rel=0.05)


def test_too_few_batches_is_no_steady_state(events):
    assert steady_state(events([0.0, 0.5, 1.0]), 8, Protocol(warmup_s=2.0)) is None


def test_grid_keys_resolve_like_the_config_and_refuse_bad_values():
    assert parse_axis("dataloader_num_workers=0,2,2,4").values == (0, 2, 4)
    assert parse_axis("model.config.n_head=2,4").key == "model.config.n_head"
    assert parse_axis("learning_rate=1e-4,3e-4").values == (1e-4, 3e-4)
    with pytest.raises(UserError, match="did you mean training.dataloader_num_workers"):
        parse_axis("dataloader_num_workrs=1")
    with pytest.raises(UserError, match="must be a whole number"):
        parse_axis("per_device_train_batch_size=1,two")
    with pytest.raises(UserError, match="at least 1"):
        parse_axis("per_device_train_batch_size=0,2")
    with pytest.raises(UserError, match="a section"):
        parse_axis("training=1")
    with pytest.raises(UserError, match="no --grid"):
        parse_grid([])
    with pytest.raises(UserError, match="empty value"):
        parse_axis("dataloader_num_workers=")


def test_hold_global_batch_keeps_the_effective_batch():
    axes = parse_grid(
        ["per_device_train_batch_size=2,4,8,16", "gradient_accumulation_steps=1,2,4,8"]
    )
    plan = build_plan(cfg(), axes, hold=True, cores=8)
    assert plan.points and all(p.params[BATCH] * p.params[ACCUM] == 16 for p in plan.points)
    derived = build_plan(
        cfg(), parse_grid(["per_device_train_batch_size=4,16,32"]), hold=True, cores=8
    )
    assert [(p.params[BATCH], p.params[ACCUM]) for p in derived.points] == [(4, 4), (16, 1), (8, 2)]
    assert derived.points[-1].baseline  # the current setting, appended


def test_plain_grid_says_when_the_effective_batch_changes():
    plan = build_plan(cfg(), parse_grid(["per_device_train_batch_size=8,32"]), hold=False, cores=8)
    assert any("effective batch varies" in n and "square-root" in n for n in plan.notes)


def test_worker_counts_above_the_cores_are_skipped_with_a_note():
    plan = build_plan(cfg(), parse_grid(["dataloader_num_workers=0,2,8"]), hold=False, cores=2)
    assert [p.skip is not None for p in plan.points] == [False, False, True]
    assert any("8" in n and "2 cores" in n for n in plan.notes)


def test_shards_partition_the_points():
    plan = build_plan(
        cfg(),
        parse_grid(["dataloader_num_workers=0,1", "per_device_train_batch_size=1,2,4"]),
        hold=False,
        cores=8,
    )
    parts = [shard(plan.points, f"{i}/3") for i in range(3)]
    assert sorted(p.index for part in parts for p in part) == [p.index for p in plan.points]
    with pytest.raises(UserError, match="0 <= I < N"):
        shard(plan.points, "3/3")


def test_coordinate_ascent_finds_a_separable_optimum_in_fewer_trials():
    workers, batch, accum = (0, 1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4)
    keys = [WORKERS, BATCH, ACCUM]
    combos = list(itertools.product(workers, batch, accum))
    from gpudoctor.sweep.plan import Point

    grid = [Point(i, dict(zip(keys, c, strict=True))) for i, c in enumerate(combos)]

    def speed(p):  # more workers help up to 4, batch 8 is best, accumulation barely matters
        w, b, a = (p.params[k] for k in keys)
        return 100 * min(w, 4) + 50 - 8 * abs(b - 8) + a

    start = adaptive.start_point(grid, {WORKERS: 0, BATCH: 1, ACCUM: 1}, len(grid))
    result = adaptive.climb(grid, adaptive.groups(keys, hold=False), start, speed)
    full_best = max(grid, key=lambda p: (speed(p), -p.index))
    assert result.best is full_best
    assert len(result.visited) < len(grid) / 3


def _doc_with(points: list[dict]) -> dict:
    grid = {
        "axes": [{"key": WORKERS, "values": [0, 2]}],
        "baseline": {WORKERS: 0},
        "global_batch": 8,
        "learning_rate": 1e-4,
        "points_total": 2,
        "shard": None,
        "shard_count": 1,
        "hold_global_batch": False,
    }
    doc = new_doc(Path("missing.yaml"), "abc", grid, Protocol().as_dict(), [], [])
    doc["points"] = points
    return doc


def _ok(index: int, workers: int, speed: float, label: str | None = None) -> dict:
    p = point_entry(index, {WORKERS: workers}, workers == 0, 8)
    p.update(
        status="ok",
        metrics={"samples_per_s": speed, "spread": 0.02, "runs": 1},
        label=label or p["label"],
    )
    return p


def test_pages_escape_what_comes_from_the_config():
    doc = finalize(_doc_with([_ok(0, 0, 10.0, "<script>alert(1)</script>"), _ok(1, 2, 25.0)]))
    page = to_html(doc)
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert "<svg" in page and "2.50×" in page
    assert "+  dataloader_num_workers: 2" in to_markdown(doc)


def test_merge_refuses_shards_of_another_sweep():
    a, b = _doc_with([_ok(0, 0, 10.0)]), _doc_with([_ok(1, 2, 20.0)])
    b["config_sha256"] = "other"
    with pytest.raises(UserError, match="another sweep"):
        merge([a, b], ["a", "b"])


class ScriptedBackend:
    """A backend whose trials give the windows listed, in order (the runner's side only)."""

    name, cores, gpu, slots, on_start = "scripted", 8, False, 1, None

    def __init__(self, rates: list[list[float]], intervals: list[float] | None = None) -> None:
        self.rates, self.intervals, self.jobs, self.queue = list(rates), intervals or [], [], []

    def submit(self, job):
        self.jobs.append(job)
        self.queue.append(job)

    def pending(self):
        return len(self.queue)

    def next_done(self):
        job = self.queue.pop(0)
        windows = [
            {"samples_per_s": r, "nonpad_tokens_per_s": None, "pad_fraction": None,
             "data_wait_share": 0.1, "batches": 5, "dt_s": 1.0}
            for r in self.rates.pop(0)
        ]  # fmt: skip
        steady = {"windows": windows, "step_intervals_s": self.intervals, "first_batch_t": 0.0,
                  "steady_from_s": 1.0, "steady_s": 3.0}  # fmt: skip
        return job, TrialRun("ok", steady=steady, peak_rss_mib=100.0)

    def close(self):
        pass


def _runner(tmp_path: Path, backend) -> Runner:
    from gpudoctor.sweep.cache import TrialCache

    return Runner(
        TrialCache(tmp_path),
        backend,
        Protocol(),
        60,
        noise=0.10,
        repeats=1,
        cost_args={"target": None, "price": None, "gpus_count": None},
        on_change=lambda: None,
    )


def _item(index: int, workers: int) -> Resolved:
    from gpudoctor.sweep.plan import Point

    entry = point_entry(index, {WORKERS: workers}, workers == 0, 8)
    text = f"dataset: {{kind: synthetic, count: 1}}\n# {index}\n"
    return Resolved(Point(index, {WORKERS: workers}), entry, cfg(), text, f"k{index}")


def test_a_noisy_point_is_measured_again_and_its_spread_kept(tmp_path):
    backend = ScriptedBackend([[50.0, 100.0, 75.0], [76.0, 74.0, 75.0]])
    item = _item(0, 0)
    _runner(tmp_path, backend).evaluate(item)
    entry = item.entry
    assert len(backend.jobs) == 2 and [j.attempt for j in backend.jobs] == [0, 1]
    assert entry["metrics"]["runs"] == 2
    assert entry["metrics"]["samples_per_s"] == pytest.approx(75.0)
    assert entry["metrics"]["spread"] == pytest.approx(50 / 75)  # kept, not hidden


def test_sparse_batch_events_still_count_every_batch(tmp_path):
    # Past a few thousand batches the hooks write a batch event for one batch in ten.
    full = event_lines([0.01 * i for i in range(1, 3001)])
    spans = [e for e in full if e["k"] != "batch"]
    sparse = spans + [e for i, e in enumerate(x for x in full if x["k"] == "batch") if i % 10 == 0]
    result = steady_state(load(sparse, tmp_path), 8, Protocol(warmup_s=1.0, window_s=5.0, windows=3))
    assert result is not None
    figures = combine([result], accumulation=1, batch_size=8)
    assert figures["samples_per_s"] == pytest.approx(800.0, rel=0.02)
    assert figures["nonpad_tokens_per_s"] == pytest.approx(6400.0, rel=0.02)


def test_a_winner_with_another_effective_batch_comes_with_lr_advice_and_an_alternative():
    same = _ok(0, 0, 100.0)
    bigger = point_entry(1, {WORKERS: 2}, False, 32)
    bigger.update(status="ok", metrics={"samples_per_s": 110.0, "spread": 0.04, "runs": 1})
    doc = finalize(_doc_with([same, bigger]))
    advice = doc["change"]["lr_advice"]
    assert advice["linear"] == pytest.approx(4e-4) and advice["sqrt"] == pytest.approx(2e-4)
    alt = doc["change"]["same_batch"]
    assert alt["index"] == 0 and alt["slower_fraction"] == pytest.approx(1 - 100 / 110)
    page = to_markdown(doc)
    assert "square-root rule" in page and "keeps your effective batch of 8" in page
