"""``--adaptive`` on a real Optuna study (SQLite), ties named by the noise, dollars that follow
the speed: the runner's side, with a backend whose trials give known speeds."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import optuna
import pytest

from gpudoctor.render.sweep_page import headline, to_markdown
from gpudoctor.replay.config import load_config_text
from gpudoctor.sweep import search
from gpudoctor.sweep.axes import BATCH, WORKERS
from gpudoctor.sweep.cache import TrialCache
from gpudoctor.sweep.costs import point_cost
from gpudoctor.sweep.plan import Point
from gpudoctor.sweep.points import Resolved
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.results import finalize, new_doc, point_entry
from gpudoctor.sweep.runner import Runner
from gpudoctor.sweep.trial import TrialRun
from gpudoctor.sweep.windows import combine

CONFIG = """
dataset: {kind: synthetic, count: 100}
training: {per_device_train_batch_size: 8, dataloader_num_workers: 0, learning_rate: 1e-4}
"""


def cfg():
    return load_config_text(CONFIG, "test.yaml")


def speed_of(params: dict[str, Any]) -> float:
    """A separable surface: workers help up to 4 (more contend), batch 8 is best."""
    w, b = params[WORKERS], params[BATCH]
    return 100.0 * min(w, 4) - 5.0 * max(0, w - 4) + 50.0 - 8.0 * abs(b - 8) + 10.0


class SurfaceBackend:
    """Trials whose steady windows run at ``speed_of`` the point (jitter-free)."""

    name, cores, gpu, slots, on_start = "surface", 64, False, 1, None

    def __init__(self, params_of: dict[str, dict[str, Any]]) -> None:
        self.params_of, self.queue, self.ran = params_of, [], []

    def submit(self, job):
        self.queue.append(job)

    def pending(self):
        return len(self.queue)

    def next_done(self):
        job = self.queue.pop(0)
        params = self.params_of[job.key]
        self.ran.append(params)
        rate = speed_of(params)
        windows = [{"samples_per_s": rate, "nonpad_tokens_per_s": 10 * rate, "pad_fraction": 0.1,
                    "data_wait_share": 0.1, "batches": 5, "dt_s": 1.0}] * 3  # fmt: skip
        steady = {"windows": windows, "step_intervals_s": [8 / rate] * 12, "first_batch_t": 0.0,
                  "steady_from_s": 1.0, "steady_s": 3.0}  # fmt: skip
        return job, TrialRun("ok", steady=steady, peak_rss_mib=100.0)

    def close(self):
        pass


GRID = {WORKERS: [0, 1, 2, 4, 8], BATCH: [1, 2, 4, 8, 16]}


def _grid(tmp_path: Path) -> tuple[list[Resolved], Runner, SurfaceBackend, dict[str, Any]]:
    items, params_of = [], {}
    for i, combo in enumerate(itertools.product(*GRID.values())):
        params = dict(zip(GRID, combo, strict=True))
        baseline = params == {WORKERS: 0, BATCH: 8}
        entry = point_entry(i, params, baseline, params[BATCH])
        text = f"dataset: {{kind: synthetic, count: 1}}\n# point {i}\n"
        items.append(Resolved(Point(i, params, baseline), entry, cfg(), text, f"key{i}"))
        params_of[f"key{i}"] = params
    backend = SurfaceBackend(params_of)
    doc = new_doc(Path("c.yaml"), "sha", _grid_doc(), Protocol().as_dict(), [], [])
    runner = Runner(TrialCache(tmp_path / "cache"), backend, Protocol(), 60, 0.1, 0,
                    {"target": None, "price": None, "gpus_count": None}, lambda: None)  # fmt: skip
    return items, runner, backend, doc


def _grid_doc() -> dict[str, Any]:
    return {
        "axes": [{"key": k, "values": v} for k, v in GRID.items()],
        "baseline": {WORKERS: 0, BATCH: 8}, "fixed": {}, "hold_global_batch": False,
        "global_batch": 8, "learning_rate": 1e-4, "points_total": 25, "grid_size": 25,
        "shard": None, "shard_count": 1,
    }  # fmt: skip


def _study(tmp_path: Path, doc: dict[str, Any]) -> optuna.Study:
    storage = search.default_storage(tmp_path)  # a SQLite file, as --adaptive's default
    return search.open_study(storage, search.study_name(doc), search.prune_margin(0.1))


def _climb(tmp_path: Path, max_trials: int) -> tuple[search.Search, SurfaceBackend, dict]:
    items, runner, backend, doc = _grid(tmp_path)
    groups = [[WORKERS], [BATCH]]
    found = search.run_climb(items, GRID, groups, {WORKERS: 0, BATCH: 8}, runner, doc,
                             _study(tmp_path, doc), max_trials, pruning=False)  # fmt: skip
    return found, backend, doc


def test_the_climb_on_a_study_finds_the_grid_winner_and_resumes_from_sqlite(tmp_path):
    first, backend, _ = _climb(tmp_path, max_trials=4)
    assert first.stopped == "--max-trials 4 reached" and len(backend.ran) == 4
    assert backend.ran[0] == {WORKERS: 0, BATCH: 8}  # the current setting first: the speedup
    # Interrupted there; the same command again opens the same study and goes on from it.
    done, backend2, doc = _climb(tmp_path, max_trials=25)
    assert done.resumed_trials == 4 and [e["params"] for e in doc["points"][:4]] == backend.ran
    assert not any(p in backend.ran for p in backend2.ran)  # nothing measured twice
    best = finalize(doc)["best"]["params"]
    assert best == max(backend.ran + backend2.ran, key=speed_of) == {WORKERS: 4, BATCH: 8}
    assert len(backend.ran) + len(backend2.ran) <= 10  # of 25: a search, not the grid


def test_tpe_on_the_study_measures_each_point_once_and_stops_by_itself(tmp_path):
    items, runner, backend, doc = _grid(tmp_path)
    found = search.run_tpe(items, GRID, runner, doc, _study(tmp_path, doc), 25, 1, pruning=False)
    assert backend.ran[0] == {WORKERS: 0, BATCH: 8}
    assert len({tuple(p.values()) for p in backend.ran}) == len(backend.ran) < 25
    assert found.stopped.startswith(f"{search.PATIENCE} measured points in a row")
    assert found.measured == [e["index"] for e in doc["points"]]


def test_a_clearly_slower_trial_is_pruned_from_its_first_window():
    study = optuna.create_study(direction="maximize", pruner=search.ClearlySlower(0.25))
    done = study.ask()
    study.tell(done, 100.0)
    close, slow = study.ask(), study.ask()
    close.report(80.0, 1)  # 20% slower: inside the margin, measured to the end
    slow.report(60.0, 1)  # 40% slower after one window: stopped
    assert not close.should_prune() and slow.should_prune()


def _ok(index: int, speed: float, intervals: list[float], baseline: bool = False) -> dict:
    steady = {"windows": [{"samples_per_s": speed, "nonpad_tokens_per_s": None, "pad_fraction": None,
                           "data_wait_share": 0.1, "batches": 5, "dt_s": 1.0}] * 3,
              "step_intervals_s": intervals}  # fmt: skip
    entry = point_entry(index, {WORKERS: index}, baseline, 8)
    entry.update(status="ok", metrics=combine([steady], 1, 8))
    return entry


def _doc(points: list[dict]) -> dict:
    grid = {**_grid_doc(), "axes": [{"key": WORKERS, "values": [0, 1, 2]}],
            "baseline": {WORKERS: 0}, "points_total": 3}  # fmt: skip
    doc = new_doc(Path("c.yaml"), "sha", grid, Protocol().as_dict(), [], [])
    doc["points"] = points
    return finalize(doc)


def test_points_inside_each_others_step_noise_are_tied_and_both_named():
    jittery = [0.10, 0.13, 0.08, 0.12, 0.09, 0.11, 0.14, 0.07] * 3  # ±~20% step to step
    steady = [0.100, 0.101, 0.099, 0.100, 0.101, 0.099, 0.100, 0.100] * 3
    doc = _doc([_ok(0, 100.0, jittery, True), _ok(1, 104.0, jittery), _ok(2, 60.0, steady)])
    assert [t["index"] for t in doc["best"]["tied_with"]] == [0]
    assert doc["points"][0]["metrics"]["noise_from"] == "step_intervals"
    text = headline(doc)
    assert text.startswith("Tied within the noise") and "workers=1" in text and "workers=0" in text
    assert "no reason to change" in text and "Tied" in to_markdown(doc)
    # The same gap between two steady points is a real one: a winner, named alone.
    clear = _doc([_ok(0, 100.0, steady, True), _ok(1, 104.0, steady)])
    assert clear["best"]["tied_with"] == [] and headline(clear).startswith("Fastest: workers=1")


def test_dollars_per_token_follow_the_measured_speed_at_the_price():
    slow = {"samples_per_s": 100.0, "nonpad_tokens_per_s": 6000.0}
    fast = {"samples_per_s": 300.0, "nonpad_tokens_per_s": 18000.0}
    args = {"target": "l4", "price": None, "gpus_count": None}
    a, b = (point_cost(cfg(), m, None, "cpu", None, **args) for m in (slow, fast))
    assert a["usd_per_mtok"] == pytest.approx(3 * b["usd_per_mtok"])
    assert a["run_usd"] == pytest.approx(3 * b["run_usd"])
    # the L4's list price, said so, since neither the command nor the config gave one
    assert a["usd_per_mtok"] == pytest.approx(a["price_per_gpu_hour"] / 3600 / 6000 * 1e6)
    assert "l4 list price" in a["basis"] and a["predicted"] is None  # no measure to predict from
    given = point_cost(cfg(), slow, None, "cpu", None, target=None, price=2.0, gpus_count=None)
    assert given["usd_per_mtok"] == pytest.approx(2.0 / 3600 / 6000 * 1e6)
    none = point_cost(cfg(), slow, None, "cpu", None, target=None, price=None, gpus_count=None)
    assert none["usd_per_mtok"] is None and none["basis"] is None  # never an invented price


class CrashEveryOtherBackend(SurfaceBackend):
    """The surface, but every second trial crashes (a status with no speed)."""

    def next_done(self):
        job, run = super().next_done()
        if len(self.ran) % 2 == 0:
            return job, TrialRun("crashed", reason="exit 1")
        return job, run


def test_tpe_resumes_a_study_whose_known_points_include_a_crash(tmp_path):
    """A resumed search ranks what it knows by speed: a crashed point has none, and is not ranked
    (it raised TypeError comparing None with a speed before)."""
    items, runner, _, doc = _grid(tmp_path)
    runner.backend = backend = CrashEveryOtherBackend(runner.backend.params_of)
    first = search.run_tpe(items, GRID, runner, doc, _study(tmp_path, doc), 4, 1, pruning=False)
    assert first.stopped == "--max-trials 4 reached"
    assert {e["status"] for e in doc["points"]} == {"ok", "crashed"}
    items, runner, _, doc = _grid(tmp_path)
    done = search.run_tpe(items, GRID, runner, doc, _study(tmp_path, doc), 6, 1, pruning=False)
    assert done.resumed_trials == 4 and len(backend.ran) == 4
    assert finalize(doc)["best"]["params"] in [e["params"] for e in doc["points"] if e["status"] == "ok"]
