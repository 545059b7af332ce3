"""``--adaptive``: an Optuna study over the grid's axes instead of every point.

Why Optuna: its TPE sampler models which values of each axis do well (the surface
over workers x batch x accumulation is close to separable, which TPE's per-axis
densities fit), its pruner interface stops a trial from its first windows, and its
storage makes the search resumable and shareable, none of which a sweep should own.

- Each axis is a categorical parameter; a suggestion that is no point of the plan
  (``--hold-global-batch`` drops combinations) is told back as pruned, unmeasured.
- The user's current setting is the first trial when it is a grid point, so the speedup
  over it is measured; a point already measured in this study (or in the trial cache) is
  told back without a new process.
- A running trial reports samples/s after each whole window; :class:`ClearlySlower` stops
  one that runs more than ``margin`` below the best finished point (local backend: the
  driver reads the trial's events as they are written).
- The search stops when :data:`PATIENCE` measured points in a row brought nothing faster,
  when every runnable point is measured, or at ``--max-trials``.
- Storage: a SQLite file in the trial cache by default, the study named by the digest of
  what the sweep measures, so running the same command again resumes it; or any Optuna
  storage URL (``--study-storage``), so several drivers share one study.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError
from gpudoctor.redact import redact_value
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


def run_search(
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
    space = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    search = Search(study.study_name, "")
    runnable = {i.point.index: i for i in items if not i.point.skip and i.key}
    by_params = {_params_key(i.point.params, axes): i for i in runnable.values()}
    if not runnable:
        raise UserError("--adaptive: no grid point can run here (all skipped); see the notes")
    known = _replay_history(study, runnable, runner, doc, search)
    base = next((i for i in runnable.values() if i.point.baseline), None)
    if base is not None and not known:
        study.enqueue_trial({a: base.point.params[a] for a in axes}, skip_if_exists=True)
    since_better, best = 0, max(known.values(), default=None, key=_speed)
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
        watch = _watch(batch[0][0], study) if pruning and len(batch) == 1 else None
        try:
            runner.evaluate_all([item for _, item in batch], watch)
        except KeyboardInterrupt:
            for trial, _ in batch:
                study.tell(trial, state=TrialState.FAIL)
            raise
        for trial, item in batch:
            entry = item.entry
            known[item.point.index] = entry
            value = _speed(entry)
            if entry["status"] == "pruned":
                trial.set_user_attr("reason", entry.get("reason"))
                study.tell(trial, state=TrialState.PRUNED)
                search.pruned.append(item.point.index)
            elif value is None:
                trial.set_user_attr("reason", f"{entry['status']}: {entry.get('reason')}")
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, value)
            search.measured.append(item.point.index)
            if value is not None and (best is None or value > (_speed(best) or 0.0)):
                best, since_better = entry, 0
            else:
                since_better += 1


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
        item = runnable.get(index) if isinstance(index, int) else None
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


def _watch(trial: optuna.trial.Trial, study: optuna.Study) -> Callable[[int, float], bool]:
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
