"""Evaluate points: from the cache, else as trials on a backend, measuring a noisy point
again; ``on_change`` rewrites ``sweep.json`` (and the pages) after every point, so an
interrupted or failing sweep keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common.errors import UserError
from gpudoctor.replay.config import ReplayConfig
from gpudoctor.sweep.axes import WORKERS, current_value
from gpudoctor.sweep.backend import Backend, TrialJob
from gpudoctor.sweep.cache import TrialCache
from gpudoctor.sweep.costs import point_cost
from gpudoctor.sweep.points import Resolved
from gpudoctor.sweep.protocol import Protocol
from gpudoctor.sweep.record import build_record
from gpudoctor.sweep.trial import TrialRun, Watch

# What the replay's prepared data depends on: one preparation per distinct value.
PREPARE_KEYS = ("dataset", "text", "tokenizer", "max_length", "padding")


@dataclass
class Runner:
    cache: TrialCache
    backend: Backend
    protocol: Protocol
    timeout_s: float
    noise: float
    repeats: int
    cost_args: dict[str, Any]
    on_change: Callable[[], None]
    display: Any = None
    trials_run: int = 0
    _runs: dict[str, list[tuple[str, TrialRun]]] = field(default_factory=dict)

    def evaluate(self, item: Resolved, watch: Watch | None = None) -> dict[str, Any]:
        """Fill ``item.entry`` from the cache or from new trials; return it."""
        self.evaluate_all([item], watch)
        return item.entry

    def evaluate_all(self, items: list[Resolved], watch: Watch | None = None) -> None:
        """Every item: skipped and cached ones at once, then the rest on the backend, as many
        at a time as it runs; each entry is filled (and the outputs rewritten) as it finishes."""
        todo: dict[str, Resolved] = {}
        for item in items:
            entry = item.entry
            if item.point.skip or item.cfg is None or item.key is None:
                entry.update(status="skipped", reason=item.point.skip)
                self._done(entry, counted=False)
                continue
            record = self.cache.load(item.key)
            entry["cached"] = record is not None
            if record is not None:
                self._fill(entry, record, item.cfg)
                self._done(entry, counted=False)
            elif item.key in todo:  # the same effective config twice: measured once
                todo[item.key + f"#{item.point.index}"] = item
            else:
                todo[item.key] = item
                self._runs[item.key] = []
                self.backend.submit(self._job(item, 0, watch))
        while self.backend.pending():
            job, run = self.backend.next_done()
            self.trials_run += 1
            self._finish(job, run, todo)

    def _finish(self, job: TrialJob, run: TrialRun, todo: dict[str, Resolved]) -> None:
        item = todo[job.key]
        assert item.cfg is not None
        runs = self._runs[job.key]
        runs.append((job.run_dir.name, run))
        record = build_record(job.key, runs, item.cfg)
        spread = (record.get("metrics") or {}).get("spread")
        noisy = record["status"] == "ok" and spread is not None and spread > self.noise
        if noisy and job.attempt < self.repeats:
            self.backend.submit(self._job(item, job.attempt + 1, None))  # pruning: first runs only
            return
        self.cache.save(record)
        for twin_key in [k for k in todo if k == job.key or k.startswith(job.key + "#")]:
            twin = todo[twin_key]
            twin.entry["cached"] = twin is not item
            self._fill(twin.entry, record, item.cfg)
            self._done(twin.entry, counted=twin is item)

    def _job(self, item: Resolved, attempt: int, watch: Watch | None) -> TrialJob:
        assert item.cfg is not None and item.key is not None
        folder = self.cache.folder(item.key)
        folder.mkdir(parents=True, exist_ok=True)
        config_yaml = folder / "config.yaml"
        config_yaml.write_text(item.yaml_text or "")
        run_dir = _free_dir(folder)
        run_dir.mkdir()  # taken now: a repeat submitted beside it gets the next name
        return TrialJob(
            key=item.key,
            label=item.entry["label"],
            config_yaml=config_yaml,
            yaml_text=item.yaml_text or "",
            run_dir=run_dir,
            protocol=self.protocol,
            timeout_s=self.timeout_s,
            batch_size=item.cfg.training.per_device_train_batch_size,
            workers=int(current_value(item.cfg, WORKERS) or 0),
            prepare_key=prepare_key(item.cfg),
            attempt=attempt,
            watch=watch,
        )

    def _done(self, entry: dict[str, Any], counted: bool) -> None:
        self.on_change()
        if self.display is not None:
            self.display.point(entry, counted)

    def _fill(self, entry: dict[str, Any], record: dict[str, Any], cfg: ReplayConfig) -> None:
        entry.update(status=record["status"], reason=record.get("reason"), key=record["key"])
        entry.update(metrics=record.get("metrics"), device=record.get("device"))
        if record["status"] != "ok" or not record.get("metrics"):
            return
        measure = self.cache.measure(record)
        device, gpu = record.get("device"), record.get("gpu_name")
        try:
            entry["cost"] = point_cost(
                cfg, record["metrics"], measure, device, gpu, **self.cost_args
            )
        except UserError as exc:  # preflight cannot price this config: say so, keep the figures
            entry["cost"], entry["reason"] = None, f"not priced: {exc}"


def prepare_key(cfg: ReplayConfig) -> str:
    """What the replay's prepared data depends on, as text: one preparation per distinct value."""
    body = {k: _plain(getattr(cfg, k)) for k in PREPARE_KEYS}
    return json.dumps({**body, "examples": cfg.replay.examples}, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _free_dir(folder: Path) -> Path:
    n = 1
    while (folder / f"run-{n}").exists():
        n += 1
    return folder / f"run-{n}"
