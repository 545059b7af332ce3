"""Write and read run folders.

Writing is append-only JSON lines with a flush at least every ``flush_s``; the
reader tolerates a truncated last line (the writer may have been killed mid
line) and says so in ``Recording.notes`` instead of failing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.errors import UserError

META_SCHEMA = "gpudoctor.run/1"


class JsonlAppender:
    """Thread-safe JSON-lines appender that flushes at most every ``flush_s``.

    A writer killed with SIGKILL loses at most the lines of the last
    ``flush_s`` seconds.
    """

    def __init__(self, path: Path, flush_s: float = 0.5) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived
        self._lock = threading.Lock()
        self._flush_s = flush_s
        self._last_flush = time.monotonic()

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"), default=_json_default)
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line + "\n")
            now = time.monotonic()
            if now - self._last_flush >= self._flush_s:
                self._fh.flush()
                self._last_flush = now

    def flush(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                self._last_flush = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                self._fh.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Read a JSON-lines file; return (rows, number of unreadable lines)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    rows.append(obj)
                else:
                    bad += 1
    except FileNotFoundError:
        pass
    return rows, bad


class RunFolder:
    """The on-disk home of one run; creates the layout and checks it is writable."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def meta_path(self) -> Path:
        return self.root / "meta.json"

    @property
    def samples_dir(self) -> Path:
        return self.root / "samples"

    @property
    def events_dir(self) -> Path:
        return self.root / "events"

    def create(self) -> RunFolder:
        try:
            self.samples_dir.mkdir(parents=True, exist_ok=True)
            self.events_dir.mkdir(parents=True, exist_ok=True)
            probe = self.root / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise UserError(
                f"cannot write to --out {self.root}: {exc.strerror or exc}; "
                "choose a writable folder with --out"
            ) from None
        return self

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace meta.json atomically (write to a temp file, then rename)."""
        meta = {"schema": META_SCHEMA, **meta}
        tmp = self.meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=_json_default))
        os.replace(tmp, self.meta_path)

    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads(self.meta_path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError:
            return {"_unreadable": True}

    def appender(self, relpath: str, flush_s: float = 0.5) -> JsonlAppender:
        return JsonlAppender(self.root / relpath, flush_s=flush_s)


@dataclass
class Recording:
    """Everything a run folder holds, loaded into memory for analysis."""

    root: Path
    meta: dict[str, Any]
    host: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def start_time(self) -> float | None:
        return self.meta.get("start_time")

    @property
    def end_time(self) -> float | None:
        return self.meta.get("end_time")


def load_recording(root: Path) -> Recording:
    """Load a run folder; partial or truncated recordings load with notes."""
    folder = RunFolder(Path(root))
    if not folder.root.is_dir():
        raise UserError(f"no run folder at {root}; pass a folder written by 'gpudoctor run'")
    meta = folder.read_meta()
    rec = Recording(root=folder.root, meta=meta)
    if not meta:
        rec.notes.append("meta.json is missing: the doctor stopped before writing it")
    elif meta.get("_unreadable"):
        rec.notes.append("meta.json is unreadable (truncated?); timings come from the samples")
        rec.meta = {}
    elif meta.get("schema") != META_SCHEMA:
        raise UserError(
            f"{folder.meta_path} has schema {meta.get('schema')!r}, expected {META_SCHEMA!r}; "
            "re-record the run with this version of gpudoctor"
        )
    bad_total = 0
    rec.host, bad = read_jsonl(folder.samples_dir / "host.jsonl")
    bad_total += bad
    rec.gpu, bad = read_jsonl(folder.samples_dir / "gpu.jsonl")
    bad_total += bad
    if folder.events_dir.is_dir():
        for path in sorted(folder.events_dir.glob("*.jsonl")):
            try:
                pid = int(path.stem)
            except ValueError:
                continue
            rows, bad = read_jsonl(path)
            bad_total += bad
            if rows:
                rec.events[pid] = rows
    if bad_total:
        rec.notes.append(f"{bad_total} truncated or unreadable line(s) skipped in the recording")
    if rec.meta and rec.meta.get("status") == "running":
        rec.notes.append("the recording did not finish (doctor killed?); this report is partial")
    _fill_missing_times(rec)
    return rec


def _fill_missing_times(rec: Recording) -> None:
    """Infer start/end from the data when meta.json did not get them."""
    times: list[float] = []
    for rows in (rec.host, rec.gpu):
        times.extend(r["t"] for r in rows if isinstance(r.get("t"), (int, float)))
    for rows in rec.events.values():
        for r in rows:
            for key in ("t", "t0"):
                if isinstance(r.get(key), (int, float)):
                    times.append(r[key])
    if not times:
        return
    if rec.meta.get("start_time") is None:
        rec.meta["start_time"] = min(times)
    if rec.meta.get("end_time") is None:
        rec.meta["end_time"] = max(times)
