"""The history database: one SQLite file private to the user, shared safely by runs finishing together.

Where: ``--history PATH``, else ``GPUDOCTOR_HISTORY`` (``off`` skips it), else
``$XDG_DATA_HOME/gpudoctor/history.sqlite3`` (``~/.local/share/...``). The folder is made 0700 and
must be the user's own, with no folder above it another user can write
(:func:`gpudoctor.common.safefs.open_private_folder`, as a run folder); the file is created 0600
without following a link and must be the user's. SQLite in WAL mode with a busy timeout, writes in
``BEGIN IMMEDIATE`` and a few retries on a busy database: two runs finishing at the same moment
both land. A file SQLite finds corrupt is renamed aside (``history.sqlite3.corrupt-<time>``),
said in one line, and a fresh database takes its place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.history.entry import Entry

FILE_NAME = "history.sqlite3"
ENV = "GPUDOCTOR_HISTORY"
OFF = ("off", "none", "0")  # GPUDOCTOR_HISTORY values that skip it
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 10.0  # SQLite waits this long for another writer's lock
RETRIES = 6  # then a busy database is retried this often, backing off from 50 ms
# SQLite's primary result codes (sqlite3's own constants are Python 3.11+)
_BUSY, _LOCKED, _CORRUPT, _NOTADB = 5, 6, 11, 26

_COLUMNS = ("id", "time", "name", "mode", "status", "started_at", "command", "script", "git_commit", "host",
            "gpu", "steps", "duration_s", "steps_per_s", "breakdown", "waste", "top_finding",
            "top_finding_waste", "folder")
_TABLE = """CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, name TEXT, mode TEXT, status TEXT,
    started_at TEXT, command TEXT NOT NULL, script TEXT, git_commit TEXT, host TEXT, gpu TEXT,
    steps INTEGER, duration_s REAL, steps_per_s REAL, breakdown TEXT NOT NULL, waste REAL,
    top_finding TEXT, top_finding_waste REAL, folder TEXT NOT NULL)"""
_INDEXES = ("CREATE INDEX IF NOT EXISTS runs_script ON runs (script)",
            "CREATE INDEX IF NOT EXISTS runs_name ON runs (name)",
            "CREATE INDEX IF NOT EXISTS runs_folder ON runs (folder)")

T = TypeVar("T")


def default_path() -> Path:
    """``$XDG_DATA_HOME/gpudoctor/history.sqlite3``, else under ``~/.local/share`` (XDG's default)."""
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "gpudoctor" / FILE_NAME


def location(flag: Path | None = None, off: bool = False) -> Path | None:
    """The database to use: ``--history`` > ``GPUDOCTOR_HISTORY`` > the default; None: skipped
    (``--no-history``, or ``GPUDOCTOR_HISTORY=off``)."""
    if off:
        return None
    if flag is not None:
        return flag
    env = os.environ.get(ENV, "").strip()
    if env.lower() in OFF:
        return None
    return Path(env).expanduser() if env else default_path()


class NoHistory(UserError):
    """No database at the path yet (nothing was indexed there)."""


class History:
    """An open history database; use as a context manager. ``create=False``: a missing file is
    :class:`NoHistory`, not made (``history``, ``check``, ``diff`` only read)."""

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path = Path(os.path.abspath(path))
        self._create = create
        self._ino: tuple[int, int] | None = None
        self._db = self._connect_or_fresh()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    # --- writing ---------------------------------------------------------------------------------

    def add(self, entry: Entry) -> int:
        """Index ``entry``; returns its id. The same run indexed again (same folder and start, as a
        re-render does) updates its row and keeps its id, name, script and commit when not given."""
        def write(db: sqlite3.Connection) -> int:
            old = db.execute("SELECT id, name, script, git_commit FROM runs WHERE folder = ? AND started_at IS ? "
                             "ORDER BY id DESC LIMIT 1", (entry.folder, entry.started_at)).fetchone()
            row = _row(entry)
            if old is None:
                names = [c for c in _COLUMNS if c != "id"]
                cur = db.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                                 [row[c] for c in names])
                return int(cur.lastrowid or 0)
            for key, kept in zip(("name", "script", "git_commit"), old[1:], strict=True):
                row[key] = row[key] if row[key] is not None else kept
            names = [c for c in _COLUMNS if c not in ("id", "time")]
            db.execute(f"UPDATE runs SET {', '.join(f'{c} = ?' for c in names)} WHERE id = ?",
                       [*(row[c] for c in names), old[0]])
            return int(old[0])

        return self._retry(lambda: self._write(write))

    # --- reading ---------------------------------------------------------------------------------

    def entries(self, script: str | None = None, limit: int | None = None) -> list[Entry]:
        """The newest first; ``script``: a path (its runs) or a bare file name (any folder's)."""
        where, params = _script_filter(script)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM runs{where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params = [*params, limit]
        return self._retry(lambda: [_entry(r) for r in self._db.execute(sql, params)])

    def get(self, entry_id: int) -> Entry | None:
        return self._one("id = ?", [entry_id])

    def named(self, name: str) -> Entry | None:
        """The newest entry given ``--name NAME``."""
        return self._one("name = ?", [name])

    def of_folder(self, folder: Path, started_at: str | None) -> Entry | None:
        """The entry of the run in ``folder`` that started at ``started_at``."""
        return self._one("folder = ? AND started_at IS ?", [os.path.abspath(folder), started_at])

    def last_before(self, script: str | None, below_id: int | None, not_folder: str) -> Entry | None:
        """The newest entry of ``script`` older than ``below_id`` (any age when None), not in ``not_folder``."""
        clauses = ["folder != ?", "script IS ?"]
        params: list[Any] = [not_folder, script]
        if below_id is not None:
            clauses.append("id < ?")
            params.append(below_id)
        return self._one(" AND ".join(clauses), params)

    def _one(self, where: str, params: list[Any]) -> Entry | None:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE {where} ORDER BY id DESC LIMIT 1"
        row = self._retry(lambda: self._db.execute(sql, params).fetchone())
        return _entry(row) if row is not None else None

    # --- opening, retrying, moving a corrupt file aside --------------------------------------------

    def _connect_or_fresh(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if not _corrupt(exc):
                raise
            self._move_aside(exc)
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        self._ino = _private_file(self.path, self._create)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            _retry_busy(lambda: db.execute("PRAGMA journal_mode=WAL").fetchone())
            self._schema(db)
        except BaseException:
            db.close()
            raise
        return db

    def _schema(self, db: sqlite3.Connection) -> None:
        def create(db: sqlite3.Connection) -> None:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise UserError(f"the history {self.path} was written by a newer gpudoctor (schema {version}); "
                                "upgrade gpudoctor, or pass --history PATH for another database")
            db.execute(_TABLE)
            for sql in _INDEXES:
                db.execute(sql)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        _retry_busy(lambda: _transaction(db, create))

    def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return _transaction(self._db, op)

    def _retry(self, op: Callable[[], T]) -> T:
        """``op``, through a busy database (retried) and a corrupt one (moved aside, then tried once more)."""
        try:
            return _retry_busy(op)
        except sqlite3.DatabaseError as exc:
            if not _corrupt(exc):
                raise
            self._db.close()
            self._move_aside(exc)
            self._db = self._connect()
            return _retry_busy(op)

    def _move_aside(self, exc: sqlite3.DatabaseError) -> None:
        """Rename the corrupt file (and its -wal, -shm) aside, under a lock so that two runs finding it
        corrupt together move it once: the second finds a fresh file and uses it."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        with _locked(self.path):
            st = safefs.lstat_regular(self.path)
            if st is None or (st.st_dev, st.st_ino) != self._ino:
                return  # already moved by another run
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
        say(f"gpudoctor: the history {self.path} is corrupt ({exc}); moved it to {aside} and started a new one",
            file=sys.stderr)


def _private_file(path: Path, create: bool) -> tuple[int, int]:
    """Make sure ``path`` is a regular 0600 file of the doctor's user in a private folder; its (dev, ino)."""
    if not create and not os.path.lexists(path):
        raise NoHistory(f"no history at {path} yet: runs are added to it as gpudoctor writes their reports "
                        "(or pass --history PATH)")
    try:
        folder = safefs.open_private_folder(path.parent, "--history folder")
    except UserError as exc:  # its problem, with this database's way out rather than a run folder's
        problem = str(exc).split("; ")[0].split(", who could")[0]
        raise UserError(f"{problem}; pass --history PATH in a folder only you can write") from None
    try:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path.name, flags, 0o600, dir_fd=folder)
        except OSError as exc:
            what = "is a symbolic link" if exc.errno == 40 else (exc.strerror or str(exc))
            raise UserError(f"cannot open the history {path}: {what}; remove it or pass --history PATH") from None
    finally:
        os.close(folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"the history {path} is not a regular file; remove it or pass --history PATH")
        if st.st_uid != os.geteuid():
            raise UserError(f"the history {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); "
                            "pass --history PATH for a file of your own")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = safefs.open_append(f"{path}.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fd.close()


def _transaction(db: sqlite3.Connection, op: Callable[[sqlite3.Connection], T]) -> T:
    """``op`` in ``BEGIN IMMEDIATE``: the write lock is taken first, so two writers never deadlock."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = op(db)
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return result


def _retry_busy(op: Callable[[], T]) -> T:
    for attempt in range(RETRIES):
        try:
            return op()
        except sqlite3.OperationalError as exc:
            if _code(exc) not in (_BUSY, _LOCKED) or attempt == RETRIES - 1:
                raise
            time.sleep(0.05 * 2**attempt * (1 + random.random()))
    raise AssertionError("unreachable")


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc)
    if "locked" in text or "busy" in text:
        return _BUSY
    if "not a database" in text or "malformed" in text:
        return _CORRUPT
    return None


def _corrupt(exc: sqlite3.DatabaseError) -> bool:
    return _code(exc) in (_CORRUPT, _NOTADB)


def _row(entry: Entry) -> dict[str, Any]:
    row = entry.to_json()
    row["breakdown"] = json.dumps(entry.breakdown)
    return row


def _entry(row: tuple[Any, ...]) -> Entry:
    values = dict(zip(_COLUMNS, row, strict=True))
    try:
        breakdown = json.loads(values["breakdown"] or "{}")
    except ValueError:
        breakdown = {}
    values["breakdown"] = breakdown if isinstance(breakdown, dict) else {}
    return Entry(**values)


def _script_filter(script: str | None) -> tuple[str, list[Any]]:
    if script is None:
        return "", []
    if os.sep in script:
        return " WHERE script = ? OR script = ?", [script, os.path.abspath(script)]
    return " WHERE script = ? OR substr(script, -length(?)) = ?", [script, f"/{script}", f"/{script}"]
