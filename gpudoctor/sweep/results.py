"""``sweep.json``: the points, the best one, and the config change that reaches it.

:func:`finalize` is a pure function of the document, so a sweep, a resumed sweep
and the merge of its shards all pick the same winner the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
from pathlib import Path
from typing import Any

from gpudoctor._version import __version__
from gpudoctor.analysis.step_noise import (
    Z as TIE_Z,  # a gap beyond two combined noises is a real one
)
from gpudoctor.common.errors import UserError
from gpudoctor.sweep import SCHEMA
from gpudoctor.sweep.points import label
from gpudoctor.sweep.summary import change, lr_advice

OBJECTIVE = "samples_per_s"
MERGE_MUST_MATCH = (
    "config_sha256",
    "axes",
    "protocol",
    "hold_global_batch",
    "points_total",
    "shard_count",
)


def new_doc(
    config: Path,
    config_sha256: str,
    grid: dict[str, Any],
    protocol: dict[str, Any],
    notes: list[str],
    argv: list[str],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": __version__,
        "config": str(config.resolve()),
        "config_sha256": config_sha256,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"name": socket.gethostname(), "cpus": available_cores()},
        "command": argv,
        "grid": grid,
        "protocol": protocol,
        "objective": OBJECTIVE,
        "points": [],
        "best": None,
        "change": None,
        "notes": list(notes),
    }


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, as DataLoader workers see it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def point_entry(
    index: int, params: dict[str, Any], baseline: bool, effective_batch: int
) -> dict[str, Any]:
    return {
        "index": index,
        "params": params,
        "label": label(params),
        "baseline": baseline,
        "effective_batch": effective_batch,
        "status": "pending",
        "reason": None,
        "cached": False,
        "key": None,
        "metrics": None,
        "cost": None,
    }


def score(point: dict[str, Any]) -> float | None:
    if point["status"] != "ok" or not point.get("metrics"):
        return None
    value: float | None = point["metrics"].get(OBJECTIVE)
    return value


def best_point(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest measured point (ties: the lower index, so shards agree)."""
    scored = [(score(p), -p["index"], p) for p in points if score(p) is not None]
    return max(scored, key=lambda s: (s[0], s[1]))[2] if scored else None


def tied_with(points: list[dict[str, Any]], best: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured points the winner does not beat beyond the noise, fastest first.

    Two points are tied when their gap is at most ``Z·√(noise_a² + noise_b²)`` of the
    winner's speed, each noise relative and from the point's own step intervals
    (:func:`gpudoctor.sweep.windows.combine`), the rule ``gpudoctor diff`` uses. A point
    without a noise figure is never called tied: that would need a noise nobody observed.
    """
    top, top_noise = score(best), best["metrics"].get("noise")
    if not top or top_noise is None:
        return []
    out = []
    for p in points:
        s, noise = score(p), (p.get("metrics") or {}).get("noise")
        if p is best or s is None or noise is None:
            continue
        gap = (top - s) / top
        limit = TIE_Z * math.hypot(top_noise, noise)
        if gap <= limit:
            out.append(
                {
                    "index": p["index"],
                    "label": p["label"],
                    OBJECTIVE: s,
                    "slower_fraction": gap,
                    "noise": noise,
                    "tie_limit": limit,
                }
            )
    return sorted(out, key=lambda t: (-t[OBJECTIVE], t["index"]))


def finalize(doc: dict[str, Any]) -> dict[str, Any]:
    """Fill ``best`` and ``change`` from the points (sorted by index)."""
    doc["points"].sort(key=lambda p: p["index"])
    best = best_point(doc["points"])
    base = next((p for p in doc["points"] if p["baseline"]), None)
    base_score = score(base) if base else None
    if best is None:
        doc["best"] = doc["change"] = None
        return doc
    top = score(best)
    doc["best"] = {
        "index": best["index"],
        "label": best["label"],
        "params": best["params"],
        OBJECTIVE: top,
        "spread": best["metrics"].get("spread"),
        "speedup_vs_current": top / base_score if top is not None and base_score else None,
        "current_index": base["index"] if base else None,
        "current_status": base["status"] if base else None,
        "noise": best["metrics"].get("noise"),
        "tied_with": tied_with(doc["points"], best),
    }
    doc["change"] = change(doc["grid"]["baseline"], best["params"])
    doc["change"]["lr_advice"] = lr_advice(doc["grid"], best["effective_batch"])
    doc["change"]["same_batch"] = _same_batch(doc, best)
    return doc


def _same_batch(doc: dict[str, Any], best: dict[str, Any]) -> dict[str, Any] | None:
    """When the winner changes the effective batch: the fastest point that keeps it.

    Often within the noise of the winner, and it needs no learning-rate retuning.
    """
    keep = doc["grid"].get("global_batch")
    if best["effective_batch"] == keep:
        return None
    alt = best_point([p for p in doc["points"] if p["effective_batch"] == keep])
    if alt is None:
        return None
    slower = 1.0 - (score(alt) or 0.0) / (score(best) or 1.0)
    noises = [p["metrics"].get("noise") for p in (alt, best)]
    within = None not in noises and slower <= TIE_Z * math.hypot(*noises)
    return {
        "index": alt["index"],
        "label": alt["label"],
        OBJECTIVE: score(alt),
        "slower_fraction": slower,
        "within_noise": within,
        "text": f"{alt['label']} keeps your effective batch of {keep} at {score(alt):.3g} samples/s, "
        f"{100 * slower:.0f}% slower"
        + (" (within the noise)" if within else "")
        + ", with no learning-rate change",
    }


def write_json(doc: dict[str, Any], folder: Path) -> Path:
    path = folder / "sweep.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
    return path


def load_doc(folder: Path) -> dict[str, Any]:
    path = folder / "sweep.json" if folder.is_dir() else folder
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"--merge {folder}: no sweep.json there (is it a sweep --out folder?)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(
            f"--merge {folder}: cannot read sweep.json ({exc.__class__.__name__})"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UserError(f"--merge {folder}: not a {SCHEMA} document")
    return doc


def merge(docs: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """One document from the shards of one sweep; they must agree on everything but their points."""
    first = docs[0]
    for doc, source in zip(docs[1:], sources[1:], strict=True):
        for key in MERGE_MUST_MATCH:
            ours = first["grid"].get(key, first.get(key))
            theirs = doc["grid"].get(key, doc.get(key))
            if ours != theirs:
                raise UserError(
                    f"--merge: {source} is from another sweep ({key} differs from {sources[0]})"
                )
    merged = json.loads(json.dumps(first))
    by_index: dict[int, dict[str, Any]] = {}
    for doc in docs:
        for point in doc["points"]:
            by_index.setdefault(point["index"], point)
    merged["points"] = list(by_index.values())
    merged["grid"]["shard"] = None
    merged["merged_from"] = sources
    merged["notes"] = list(dict.fromkeys(n for d in docs for n in d.get("notes", [])))
    missing = sorted(set(range(first["grid"]["points_total"])) - set(by_index))
    if missing:
        merged["notes"].append(
            f"{len(missing)} points are missing (indices {_ranges(missing)}): "
            "a shard was not given or did not finish"
        )
    return finalize(merged)


def _ranges(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:10])) + (" ..." if len(indices) > 10 else "")
