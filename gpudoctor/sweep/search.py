"""``--adaptive``: a search over the grid on an Optuna study instead of every point.

Why Optuna: its storage makes a search resumable and shareable, its pruner interface
stops a trial from its first windows, and its samplers are there to choose from; none
of that is a sweep's to own. Two strategies run on the same study:

- ``climb`` (default): coordinate ascent from the current setting (:mod:`.adaptive`),
  each point it visits enqueued as a trial; it stops after a pass that moved nothing.
- ``tpe``: Optuna's TPE sampler, each axis a categorical parameter, the current setting
  first; it stops when :data:`PATIENCE` measured points in a row brought nothing faster.
  A suggestion that is no point of the plan (``--hold-global-batch`` drops combinations)
  is told back as pruned, unmeasured; a point measured before is told its value again.

Measured on the README's 9-point grid (docs/sweep.md): climb stopped after 7 trials,
TPE after 7.3 on average over 20 seeds (8 with the default seed 0), both with the full
grid's winner; on a separable 25-point surface climb needs 9 and TPE 12-14, missing the
optimum in about half the seeds. So climb is the default.

Both stop at ``--max-trials`` too. A running trial reports samples/s after each whole
window; :class:`ClearlySlower` stops one that runs more than ``margin`` below the best
finished point (local backend: the driver reads the trial's events as they are written).
The study lives in a SQLite file in the trial cache by default, named by the digest of
what the sweep measures, so the same command again resumes it; ``--study-storage`` takes
any Optuna storage URL, so several drivers share one study.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.common.redact import redact_value
from gpudoctor.sweep import adaptive
from gpudoctor.sweep.plan import Point
from gpudoctor.sweep.points import Resolved
from gpudoctor.sweep.runner import Runner

try:
    import optuna  # optional: pip install 'gpudoctor[optuna]'
except ImportError:  # pragma: no cover - the test extra installs it
    raise UserError("--adaptive needs optuna: pip install 'gpudoctor[optuna]'") from None

from optuna.trial import TrialState

SEED = 0  # the same grid gives the same sequence of trials
STARTUP_TRIALS = 3  # random suggestions before TPE models the axes
PATIENCE = 3  # measured points in a row that brought nothing faster: stop
MIN_PRUNE_MARGIN = 0.25
STUDIES_FILE = "studies.db"


class ClearlySlower(optuna.pruners.BasePruner):
    """Prune a trial whose windows so far run more than ``margin`` below the best finished one.

    Optuna's median and percentile pruners compare with the typical trial; a sweep wants
    only the clearly losing points stopped, so the bar is the best point, less the noise.
    """

    def __init__(self, margin: float) -> None:
        self.margin = margin

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        done = [
            t.value
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None
        ]
        return bool(done) and trial.intermediate_values[step] < (1 - self.margin) * max(done)


@dataclass
class Search:
    """What the study did, for ``sweep.json``'s ``adaptive`` section."""

    study_name: str
    storage: str
    measured: list[int] = field(default_factory=list)  # point indices, in the order measured
    pruned: list[int] = field(default_factory=list)
    resumed_trials: int = 0
    stopped: str = ""


def study_name(doc: dict[str, Any]) -> str:
    """The same sweep (config, axes, protocol, held batch, host cores) names the same study."""
    grid = doc["grid"]
    body = {
        "config": doc["config_sha256"],
        "axes": grid["axes"],
        "hold": grid["hold_global_batch"],
        "fixed": grid["fixed"],
        "protocol": doc["protocol"],
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return f"gpudoctor-sweep-{digest[:16]}"


def default_storage(cache_root: Path) -> str:
    return f"sqlite:///{cache_root.resolve() / STUDIES_FILE}"


def open_study(storage: str, name: str, margin: float) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(
            study_name=name,
            storage=storage,
            direction="maximize",
            load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=SEED, n_startup_trials=STARTUP_TRIALS),
            pruner=ClearlySlower(margin),
        )
    except (ImportError, ValueError, RuntimeError, optuna.exceptions.OptunaError) as exc:
        # SQLAlchemy's errors are RuntimeErrors' cousins; keep the line short and secret-free
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"--study-storage {redact_value(storage)}: cannot open the Optuna study "
            f"({redact_value(first)[:160]})"
        ) from None


def run_tpe(
    items: list[Resolved],
    choices: dict[str, list[Any]],
    runner: Runner,
    doc: dict[str, Any],
    study: optuna.Study,
    max_trials: int,
    parallel: int,
    pruning: bool,
) -> Search:
    """Ask, measure, tell until the stop rule; every measured entry goes into ``doc["points"]``."""
    axes = list(choices)
    space: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    search = Search(study.study_name, "")
    runnable = {i.point.index: i for i in items if not i.point.skip and i.key}
    by_params = {_params_key(i.point.params, axes): i for i in runnable.values()}
    if not runnable:
        raise UserError("--adaptive: no grid point can run here (all skipped); see the notes")
    known = _replay_history(study, runnable, runner, doc, search)
    base = next((i for i in runnable.values() if i.point.baseline), None)
    if base is not None and not known:
        study.enqueue_trial({a: base.point.params[a] for a in axes}, skip_if_exists=True)
    measured = [e for e in known.values() if _speed(e) is not None]  # a crashed point has no speed to rank
    since_better, best = 0, max(measured, default=None, key=lambda e: _speed(e) or 0.0)
    asks = 0
    while True:
        stop = _stop_reason(known, runnable, since_better, max_trials, search, asks)
        if stop:
            search.stopped = stop
            return search
        batch: list[tuple[optuna.trial.Trial, Resolved]] = []
        for _ in range(parallel):
            trial = study.ask(space)
            asks += 1
            item = by_params.get(_params_key(trial.params, axes))
            if item is None:  # not a point of the plan (held batch, skipped)
                study.tell(trial, state=TrialState.PRUNED)
            elif item.point.index in known or any(b[1] is item for b in batch):
                value = _speed(known.get(item.point.index))
                if value is None:
                    study.tell(trial, state=TrialState.PRUNED)
                else:
                    study.tell(trial, value)
            else:
                trial.set_user_attr("index", item.point.index)
                batch.append((trial, item))
        if not batch:
            continue
        for _, item in batch:
            doc["points"].append(item.entry)
        watch = _watch(batch[0][0]) if pruning and len(batch) == 1 else None
        _measure(batch, runner, study, watch)
        for trial, item in batch:
            value = _tell(study, trial, item.entry, search)
            known[item.point.index] = item.entry
            if value is not None and (best is None or value > (_speed(best) or 0.0)):
                best, since_better = item.entry, 0
            else:
                since_better += 1


def run_climb(
    items: list[Resolved],
    choices: dict[str, list[Any]],
    groups: list[list[str]],
    baseline: dict[str, Any],
    runner: Runner,
    doc: dict[str, Any],
    study: optuna.Study,
    max_trials: int,
    pruning: bool,
) -> Search:
    """Coordinate ascent (:mod:`gpudoctor.sweep.adaptive`) whose every trial is a trial of the
    study: the same storage, resume, sharing and pruning as the TPE search."""
    space: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    search = Search(study.study_name, "")
    runnable = {i.point.index: i for i in items if not i.point.skip and i.key}
    if not runnable:
        raise UserError("--adaptive: no grid point can run here (all skipped); see the notes")
    known = _replay_history(study, runnable, runner, doc, search)

    def score(point: Point) -> float | None:
        if point.index in known:
            return _speed(known[point.index])
        if len(search.measured) >= max_trials:
            search.stopped = f"--max-trials {max_trials} reached"
            return None
        item = runnable[point.index]
        study.enqueue_trial({k: point.params[k] for k in choices})
        trial = study.ask(space)
        trial.set_user_attr("index", point.index)
        doc["points"].append(item.entry)
        _measure([(trial, item)], runner, study, _watch(trial) if pruning else None)
        known[point.index] = item.entry
        return _tell(study, trial, item.entry, search)

    grid = [i.point for i in items]
    start = adaptive.start_point(grid, baseline, len(grid))
    if start is None:
        raise UserError("--adaptive: no grid point can run here (all skipped); see the notes")
    result = adaptive.climb(grid, groups, start, score)
    search.stopped = search.stopped or f"a pass over every axis moved nothing (pass {result.passes})"
    return search


def _measure(
    batch: list[tuple[optuna.trial.Trial, Resolved]],
    runner: Runner,
    study: optuna.Study,
    watch: Callable[[int, float], bool] | None,
) -> None:
    try:
        runner.evaluate_all([item for _, item in batch], watch)
    except KeyboardInterrupt:  # the study must not keep them as running forever
        for trial, _ in batch:
            study.tell(trial, state=TrialState.FAIL)
        raise


def _tell(
    study: optuna.Study, trial: optuna.trial.Trial, entry: dict[str, Any], search: Search
) -> float | None:
    """Tell the study how the point ended; its speed, or None."""
    value = _speed(entry)
    index = entry["index"]
    if entry["status"] == "pruned":
        trial.set_user_attr("reason", entry.get("reason"))
        study.tell(trial, state=TrialState.PRUNED)
        search.pruned.append(index)
    elif value is None:
        trial.set_user_attr("reason", f"{entry['status']}: {entry.get('reason')}")
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, value)
    search.measured.append(index)
    return value


def _stop_reason(
    known: dict[int, dict[str, Any]],
    runnable: dict[int, Resolved],
    since_better: int,
    max_trials: int,
    search: Search,
    asks: int,
) -> str | None:
    if len(known) >= len(runnable):
        return "every runnable point measured"
    if since_better >= PATIENCE and any(_speed(e) is not None for e in known.values()):
        return f"{PATIENCE} measured points in a row brought nothing faster"
    if len(search.measured) >= max_trials:
        return f"--max-trials {max_trials} reached"
    if asks >= 20 * len(runnable):
        return "the sampler keeps proposing measured points: converged"
    return None


def _replay_history(
    study: optuna.Study,
    runnable: dict[int, Resolved],
    runner: Runner,
    doc: dict[str, Any],
    search: Search,
) -> dict[int, dict[str, Any]]:
    """Points this study measured before (a resumed or shared study): back in the document,
    finished ones from the trial cache, pruned ones as they ended."""
    known: dict[int, dict[str, Any]] = {}
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    for trial in study.get_trials(deepcopy=False, states=done):
        index = trial.user_attrs.get("index")
        if not isinstance(index, int):
            continue
        item = runnable.get(index)
        if item is None or index in known:
            continue
        search.resumed_trials += 1
        if trial.state == TrialState.COMPLETE and runner.cache.load(item.key or "") is not None:
            runner.evaluate(item)  # from the cache: no process
        else:
            status = "pruned" if trial.state == TrialState.PRUNED else "crashed"
            item.entry.update(status=status, reason=trial.user_attrs.get("reason"))
        doc["points"].append(item.entry)
        known[index] = item.entry
    return known


def _watch(trial: optuna.trial.Trial) -> Callable[[int, float], bool]:
    def watch(windows: int, samples_per_s: float) -> bool:
        trial.report(samples_per_s, windows)
        return trial.should_prune()

    return watch


def _speed(entry: dict[str, Any] | None) -> float | None:
    if not entry or entry.get("status") != "ok":
        return None
    return (entry.get("metrics") or {}).get("samples_per_s")


def _params_key(params: dict[str, Any], axes: list[str]) -> str:
    return json.dumps([params.get(a) for a in axes], default=str)


def prune_margin(noise: float) -> float:
    """How much slower than the best counts as clearly slower: twice the repeat threshold."""
    return max(MIN_PRUNE_MARGIN, 2 * noise)
