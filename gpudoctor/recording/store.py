"""Write and read run folders.

Writing is append-only JSON lines with a flush at least every ``flush_s``; the
reader tolerates a truncated last line (the writer may have been killed mid
line) and says so in ``Recording.notes`` instead of failing. Everything the
doctor writes is private to its user: the run folder is 0700, files 0600, and every
file is new (``O_EXCL | O_NOFOLLOW``) or replaced by rename (:mod:`gpudoctor.common.safefs`), so
a link planted in a folder handed to the doctor is never written through.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.common.wording import plural
from gpudoctor.recording import claim, clock, length_cost, warm_compute
from gpudoctor.recording.clock import ClockSteps
from gpudoctor.recording.length_cost import LengthCost
from gpudoctor.recording.read import (  # noqa: F401 - read_jsonl re-exported
    Budget,
    read_events,
    read_jsonl,
    read_samples,
)
from gpudoctor.recording.records import LoopData, Records
from gpudoctor.recording.validate import clean_gpu_row, clean_host_row, clean_meta
from gpudoctor.recording.warm_compute import WarmCompute

META_SCHEMA = "gpudoctor.run/1"
MAX_META_BYTES = 4 * 2**20  # meta.json is a few kB; a folder handed over may hold anything


class JsonlAppender:
    """Thread-safe JSON-lines appender that flushes at most every ``flush_s``.

    A writer killed with SIGKILL loses at most the lines of the last
    ``flush_s`` seconds. The file must be new (``O_EXCL | O_NOFOLLOW``): nothing planted
    is ever appended to. A file that cannot be created or written (disk full, folder gone,
    a name already taken) stops the appender and is kept in ``error`` for the caller to
    report; it never raises into the sampler that feeds it.
    """

    def __init__(self, path: Path, flush_s: float = 0.5) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._flush_s = flush_s
        self._last_flush = time.monotonic()
        self.error: OSError | None = None
        self._fh: Any = None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fh = os.fdopen(safefs.create_new(self.path), "w", encoding="utf-8")
        except OSError as exc:
            self.error = exc

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"), default=_json_default)
        with self._lock:
            if self._fh is None or self._fh.closed:
                return
            now = time.monotonic()
            self._guard(lambda: self._fh.write(line + "\n"))
            if now - self._last_flush >= self._flush_s:
                self._guard(self._fh.flush)
                self._last_flush = now

    def flush(self) -> None:
        with self._lock:
            if self._fh is not None and not self._fh.closed:
                self._guard(self._fh.flush)
                self._last_flush = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None and not self._fh.closed:
                self._guard(self._fh.close)

    def _guard(self, op: Any) -> None:
        try:
            op()
        except OSError as exc:
            self.error = exc
            with contextlib.suppress(OSError):  # stop: what was flushed is a valid, shorter recording
                self._fh.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


class RunFolder:
    """The on-disk home of one run; claims the folder and creates its layout.

    ``root``: the folder as the user named it (for what is shown, and for the training's hooks).
    ``at``: where the doctor reads and writes it: once created, ``/proc/self/fd/N`` of
    the descriptor it holds, so a folder renamed and replaced by a link redirects nothing.
    ``previous``: where :meth:`create` moved an earlier recording found in the folder.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.at = self.root
        self.fd: int | None = None
        self.previous: Path | None = None

    @property
    def meta_path(self) -> Path:
        return self.at / "meta.json"

    @property
    def samples_dir(self) -> Path:
        return self.at / "samples"

    @property
    def events_dir(self) -> Path:
        return self.at / "events"

    def create(self) -> RunFolder:
        """Claim the folder for one recording, or refuse it in one line.

        The folders above it must be ones no other user can write, and a new folder is made
        0700; an existing one must be the doctor's user's own and writable by nobody else
        (:func:`safefs.open_private_folder`), and not in use by another doctor
        (:func:`claim.lock`). It stays open: everything after goes through that descriptor.
        An earlier recording in it is moved to ``previous-<time>/`` (said on stderr), so this
        run starts fresh and loses nothing.
        """
        fd = claim.lock(safefs.open_private_folder(self.root, "--out"), self.root)
        self.fd = fd
        if safefs.fd_path(fd).is_dir():
            self.at = safefs.fd_path(fd)
        try:
            self.previous = claim.set_aside(fd, self.root)
            for sub in ("samples", "events"):
                os.mkdir(sub, 0o700, dir_fd=fd)
            probe = f".write-test-{secrets.token_hex(4)}"
            pfd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=fd)
            try:
                os.write(pfd, b"ok")
            finally:
                os.close(pfd)
                os.unlink(probe, dir_fd=fd)
        except OSError as exc:
            raise UserError(
                f"cannot write to --out {self.root}: {exc.strerror or exc}; "
                "choose a writable folder with --out"
            ) from None
        if self.previous is not None:
            say(f"gpudoctor: --out {self.root} held an earlier recording; moved it to {self.previous} "
                "(this run starts fresh)", file=sys.stderr)
        return self

    def share(self, uid: int, gid: int, names: tuple[str, ...]) -> None:
        """A root doctor attached to another user's process: that user writes ``names`` (``attach``, ``events``).

        The run folder becomes traversable (0711, not listable) and each named subfolder hers, 0700.
        Each is changed on its own descriptor (``fchmod``/``fchown``, opened ``O_NOFOLLOW`` below
        the held folder): a link put in place of either is refused, never followed.
        """
        assert self.fd is not None, "share() needs a created folder"
        os.chmod(self.fd, 0o711)
        for name in names:
            sub = safefs.open_folder(name, dir_fd=self.fd)
            try:
                os.chmod(sub, 0o700)
                os.fchown(sub, uid, gid)
            finally:
                os.close(sub)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace meta.json atomically (a new temp file, then rename over it)."""
        meta = {"schema": META_SCHEMA, **meta}
        safefs.replace_file(self.meta_path, json.dumps(meta, indent=2, default=_json_default))

    def read_meta(self) -> dict[str, Any]:
        """meta.json as a dict; ``{}`` if missing, ``{"_unreadable": True}`` if it is not a JSON object."""
        try:  # a folder handed over may hold a link or a FIFO here: never followed, never waited on
            owner = os.stat(self.at).st_uid
            meta = json.loads(safefs.read_bytes(self.meta_path, owner=owner, limit=MAX_META_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError):  # truncated, binary, a link, too big, too deep
            return {"_unreadable": True}
        return meta if isinstance(meta, dict) else {"_unreadable": True}

    def appender(self, relpath: str, flush_s: float = 0.5) -> JsonlAppender:
        return JsonlAppender(self.at / relpath, flush_s=flush_s)


@dataclass
class Recording:
    """Everything a run folder holds, loaded into memory for analysis.

    ``events[pid]`` is that process's events, parsed once into a typed collection per kind
    (:class:`~gpudoctor.recording.records.Records`; steps and spans compact in its ``loop``).
    """

    root: Path
    meta: dict[str, Any]
    host: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    events: dict[int, Records] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    event_owners: dict[int, int] = field(default_factory=dict)  # pid -> uid owning its events file
    length_cost: LengthCost | None = None  # seconds of a batch at several widths, timed after the run
    warm_compute: WarmCompute | None = None  # a stand-in step back to back and after a build, timed after the run
    clock: ClockSteps = field(default_factory=ClockSteps)  # the wall clock's steps, taken out of every time on load

    @property
    def loops(self) -> dict[int, LoopData]:
        """Steps and spans, per pid that has any (see read.py)."""
        return {pid: r.loop for pid, r in self.events.items() if r.loop}

    @property
    def start_time(self) -> float | None:
        return self.meta.get("start_time")

    @property
    def end_time(self) -> float | None:
        return self.meta.get("end_time")


def load_recording(root: Path) -> Recording:
    """Load a run folder; partial, truncated or garbled recordings load with notes.

    Never raises anything but :class:`UserError`: lines that cannot be read or
    fail :mod:`gpudoctor.recording.validate` are dropped and counted. Large
    sample files are evenly downsampled (see :mod:`gpudoctor.recording.read`).
    """
    with safefs.pinned_folder(Path(root), "run folder") as pinned:
        if not pinned.is_dir():
            raise UserError(f"no run folder at {root}; pass a folder written by 'gpudoctor run'")
        rec = _load(RunFolder(pinned), Path(root) / "meta.json")
    rec.root = Path(root)
    return rec


def _load(folder: RunFolder, meta_shown: Path) -> Recording:
    """The recording of ``folder`` (one open descriptor, :func:`safefs.pinned_folder`)."""
    meta = folder.read_meta()
    rec = Recording(root=folder.root, meta=meta)
    if not meta:
        rec.notes.append("meta.json is missing: the doctor stopped before writing it")
    elif meta.get("_unreadable"):
        rec.notes.append("meta.json is unreadable (truncated?); timings come from the samples")
        rec.meta = {}
    elif meta.get("schema") != META_SCHEMA:
        raise UserError(
            f"{meta_shown} has schema {str(meta.get('schema'))[:80]!r}, expected {META_SCHEMA!r}; "
            "re-record the run with this version of gpudoctor"
        )
    fixed = clean_meta(rec.meta)
    if fixed:
        rec.notes.append(f"meta.json had unexpected values for {', '.join(fixed)}; they were ignored")
    if rec.meta.get("start_note"):
        rec.notes.append(str(rec.meta["start_note"])[:300])
    with _subfolder(folder.root, "samples", rec.notes) as samples:
        rec.host, bad_host = read_samples(samples / "host.jsonl", clean_host_row, notes=rec.notes) \
            if samples else ([], 0)
        rec.gpu, bad_gpu = read_samples(samples / "gpu.jsonl", clean_gpu_row, notes=rec.notes) \
            if samples else ([], 0)
    # the wall clock's steps, from the doctor's own rows and its readings at the start and the end
    rec.clock = clock.from_rows([*rec.host, *rec.gpu, *rec.meta.get("clock", [])])
    rec.notes += rec.clock.notes
    if rec.clock:
        rec.clock.fix_rows(rec.host)
        rec.clock.fix_rows(rec.gpu)
        rec.clock.fix_rows([rec.meta], ("start_time", "end_time"))
    bad_events = 0
    extents: list[float] = [r["t"] for rows in (rec.host, rec.gpu) for r in (rows[:1] + rows[-1:])]
    budget = Budget()  # the folder's, shared by its events files
    with _subfolder(folder.root, "events", rec.notes) as events_dir:
        for path in sorted(events_dir.glob("*.jsonl")) if events_dir else []:
            try:
                pid = int(path.stem)
            except ValueError:
                continue
            loaded = read_events(path, budget=budget, clock=rec.clock)
            bad_events += loaded.bad
            rec.notes += loaded.notes  # a refused file (link, FIFO, stranger's), over-long lines, a cut budget
            if loaded.owner is not None:
                rec.event_owners[pid] = loaded.owner
            if loaded.records:
                rec.events[pid] = loaded.records
            extents += [t for t in (loaded.t_min, loaded.t_max) if t is not None]
    if bad_host + bad_gpu:
        rec.notes.append(f"{plural(bad_host + bad_gpu, 'truncated, unreadable or invalid sample line')} skipped")
    if bad_events:
        rec.notes.append(f"{plural(bad_events, 'truncated, unreadable or invalid event line')} skipped")
    if rec.meta and rec.meta.get("status") == "running":
        rec.notes.append("the recording did not finish (doctor killed?); this report is partial")
    rec.length_cost = length_cost.read(folder.root)
    rec.warm_compute = warm_compute.read(folder.root)
    _fill_missing_times(rec, extents)
    return rec


@contextlib.contextmanager
def _subfolder(root: Path, name: str, notes: list[str]) -> Iterator[Path | None]:
    """``root/name`` opened once, never through a link (a note says so); None when it is absent."""
    fd: int | None = None
    try:
        fd = _open_sub(root, name)
    except FileNotFoundError:
        pass
    except OSError as exc:
        why = "it is a symbolic link" if "symbolic link" in str(exc) else (exc.strerror or str(exc))[:160]
        notes.append(f"{name}/ skipped: {why}; gpudoctor reads only real folders, never through a link")
    if fd is None:
        yield None
        return
    try:
        yield safefs.fd_path(fd) if safefs.fd_path(fd).is_dir() else root / name
    finally:
        os.close(fd)


def _open_sub(root: Path, name: str) -> int:
    parent = safefs.open_dir(root)
    try:
        return safefs.open_folder(name, dir_fd=parent)
    finally:
        os.close(parent)


def _fill_missing_times(rec: Recording, times: list[float]) -> None:
    """Infer start/end from the data when meta.json did not get them."""
    if not times:
        return
    if rec.meta.get("start_time") is None:
        rec.meta["start_time"] = min(times)
    if rec.meta.get("end_time") is None:
        rec.meta["end_time"] = max(max(times), rec.meta["start_time"])
