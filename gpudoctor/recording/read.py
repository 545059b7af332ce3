"""Fast, tolerant readers for the JSON-lines files of a run folder.

A day-long run at 10 Hz leaves ~2 GB of samples (8 GPUs) and ~400k event lines,
and ``gpudoctor report`` must still answer in seconds and a few hundred MB
(``bench/long_report.py`` measures it):

* Sample files larger than :data:`FULL_READ_BYTES` are read at
  :data:`MAX_SAMPLE_ROWS` evenly spaced byte offsets (rows are time-ordered and
  of similar length, so that is an even spread over time) plus the last row.
  The analysis only takes means, maxima and a 2,000-point timeline from them.
* Event files are read whole (the breakdown needs every span), parsed a few
  thousand lines per ``json.loads`` call (one call per line costs more than the
  parsing), checked by :mod:`gpudoctor.recording.validate`, and typed once into
  :class:`~gpudoctor.recording.records.Records` (a collection per kind): ``counter``
  lines are summed per name and side of the first step (totals are all the analysis
  reads), and steps and spans, most of a long run, are kept as plain times and
  intervals (:class:`LoopData`) rather than dicts.

Every reader has a budget (:class:`Budget`): an events file is read up to
:data:`MAX_EVENT_FILE_BYTES` and :data:`MAX_EVENTS_PER_FILE` lines, a folder's
events files together up to :data:`MAX_FOLDER_EVENT_BYTES` and
:data:`MAX_FOLDER_EVENTS`; a sparse (holey) file, which claims gigabytes it does
not hold, is read by its data only (its holes are seeks, not zeros); a ``batch`` line keeps at most
:data:`~gpudoctor.common.batchlengths.MAX_BATCH_LENGTHS` lengths (exact count and
longest beside them), and a folder at most :data:`MAX_FOLDER_LENGTHS` in all.
Bytes on disk do not bound memory (``{"k":"x"}`` is 10 bytes on disk and ~250 in memory; 100 MB
of such lines once took 2.5 GB): so a line of a kind no part of this version reads is dropped and
counted, what is kept is charged at what it holds in memory (:func:`kept_bytes`) against
:data:`MAX_FOLDER_KEPT_BYTES` (a sample file's rows against :data:`MAX_SAMPLE_KEPT_BYTES`), and a
file is read in blocks of :data:`_BLOCK_BYTES`, whose parsed lines are what is held at once.
What a budget cut is said in a note, and the report is built from the rest.

Every reader tolerates truncated, garbled or binary lines: they are counted,
never raised. A run folder may come from anyone (``attach`` lets the patient's user
write ``events/``; ``report`` reads folders handed to it), so files are opened
through :mod:`gpudoctor.common.safefs` (never through a link, never blocking on a FIFO,
owned by the doctor's user or the folder's owner) and read in bounded blocks: a
line over :data:`MAX_LINE_BYTES` is skipped while streaming, never held whole.
Each such skip is a counted line in :attr:`ReadIssues.notes`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpudoctor.common import batchlengths
from gpudoctor.common.safefs import is_holey, is_pinned, open_read
from gpudoctor.common.wording import plural
from gpudoctor.core.events import NO_BATCH_WAIT, SpanEvent
from gpudoctor.recording.clock import ClockSteps
from gpudoctor.recording.records import LoopData, Records
from gpudoctor.recording.validate import (
    KNOWN_KINDS,
    TIME_FIELDS,
    clean_event,
    fast_counter,
    fast_span,
    fast_step,
    is_time,
)

try:  # ~3x faster than the json module on these lines; what it rejects (NaN) falls back to json
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay usable without it
    _fast_loads = json.loads  # type: ignore[assignment]  # the same call, a wider signature

FULL_READ_BYTES = 16 * 2**20
MAX_SAMPLE_ROWS = 1_999  # + the last row: 2,000, what the timeline draws
_BLOCK_BYTES = 2**20  # parsed at once: a block of tiny lines is ~25x its size in objects
MAX_LINE_BYTES = 4 * 2**20  # a hook's longest line (argv, settings) is a few kB
_CHUNK_LINES = 2_000
_BAD = object()
# Budgets (read when a reader starts, so a test can lower them): a day-long run of 8 ranks
# writes ~400k event lines (~40 MB) per rank; these are several times that.
MAX_EVENT_FILE_BYTES = 512 * 2**20
MAX_EVENTS_PER_FILE = 4_000_000
MAX_FOLDER_EVENT_BYTES = 2 * 2**30
MAX_FOLDER_EVENTS = 12_000_000
MAX_FOLDER_LENGTHS = 2_000_000  # batch lengths kept in all (beyond: exact rows and longest only)
MAX_SAMPLE_BYTES = 64 * 2**20  # of one sample file's lines held at once (2,000 real rows: a few MB)
# Memory of what is kept, as kept_bytes counts it: a day-long run of 8 ranks keeps ~450 MB (steps and
# spans at STEP_BYTES and SPAN_BYTES, 2 M batch lengths); a 16 MiB sample file read whole ~60 MB.
MAX_FOLDER_KEPT_BYTES = 2**30
MAX_SAMPLE_KEPT_BYTES = 256 * 2**20
STEP_BYTES = 32  # a step's time: a float (24) in a list (8)
SPAN_BYTES = 112  # a span's (start, end): a tuple (56) of two floats (48) in a list (8)
NAME_BYTES = 160  # a span category's or name's first appearance: its string and dict entries
_CONTAINERS = (dict, list)


@dataclass
class Budget:
    """What a folder's readers may still take: bytes and lines of events, batch lengths."""

    bytes_left: int = -1  # -1: the module's folder cap, read when the budget is made
    events_left: int = -1
    lengths_left: int = -1
    memory_left: int = -1  # bytes of memory what is kept may still take (kept_bytes)

    def __post_init__(self) -> None:
        if self.bytes_left < 0:
            self.bytes_left = MAX_FOLDER_EVENT_BYTES
        if self.events_left < 0:
            self.events_left = MAX_FOLDER_EVENTS
        if self.lengths_left < 0:
            self.lengths_left = MAX_FOLDER_LENGTHS
        if self.memory_left < 0:
            self.memory_left = MAX_FOLDER_KEPT_BYTES


def kept_bytes(value: Any) -> int:
    """What a parsed JSON value holds in memory: each container's and scalar's own size
    (``sys.getsizeof``), shared objects (cached keys, small ints) counted each time they appear,
    so a little over the truth. Lists of scalars, the big ones (batch lengths), are summed in C."""
    total = 0
    stack = [value]
    getsizeof = sys.getsizeof
    while stack:
        v = stack.pop()
        if type(v) is dict:
            total += getsizeof(v) + sum(map(getsizeof, v))
            items: Any = v.values()
        elif type(v) is list:
            total += getsizeof(v)
            items = v
        else:
            total += getsizeof(v)
            continue
        total += sum(map(getsizeof, items))  # a container among them counts itself when popped
        if not set(map(type, items)).isdisjoint(_CONTAINERS):
            inner = [x for x in items if type(x) in _CONTAINERS]
            total -= sum(map(getsizeof, inner))
            stack += inner
    return total


def _parse_one(line: bytes) -> Any:
    for parse in (_fast_loads, json.loads):  # orjson refuses NaN and ints beyond 64 bits; json takes them
        try:
            return parse(line)
        except (ValueError, RecursionError):  # bad JSON or UTF-8, huge ints, deep nesting
            pass
    try:
        return json.loads(line.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return _BAD


def parse_lines(lines: list[bytes]) -> list[Any]:
    """Parse JSON lines: one object per non-blank line, ``_BAD`` for unreadable ones."""
    lines = list(filter(None, lines))
    out: list[Any] = []
    for i in range(0, len(lines), _CHUNK_LINES):
        chunk = lines[i : i + _CHUNK_LINES]
        try:
            parsed = _fast_loads(b"[" + b",".join(chunk) + b"]")
        except (ValueError, RecursionError):
            parsed = None
        if type(parsed) is list and len(parsed) == len(chunk):
            out += parsed
        else:  # a bad or blank line (or one holding several values) in the chunk: one by one
            out += [_parse_one(line) for line in chunk if line.strip()]
    return out


@dataclass
class ReadIssues:
    """What a reader refused: a file it would not open, lines over the cap. Never raised."""

    name: str = ""
    unsafe: str | None = None  # why the file was not read (a link, a FIFO, a stranger's file)
    holey: str | None = None  # a sparse file: what it claims and what it holds (read by its data only)
    long_lines: int = 0
    holes: int = 0  # lines broken by a hole shorter than the line cap
    max_line: int = MAX_LINE_BYTES
    max_bytes: int | None = None  # read no further than this (the budget's share of this file)
    bytes_read: int = 0
    cut: str | None = None  # the budget that stopped the reader, said in a note
    owner: int | None = None  # the file's owner, from its descriptor

    @property
    def bad(self) -> int:
        """Counted with the unreadable lines: a refused file as one, each skipped line as one."""
        return (self.unsafe is not None) + self.long_lines + self.holes

    @property
    def notes(self) -> list[str]:
        out = []
        if self.unsafe is not None:
            out.append(f"{self.name} skipped: {self.unsafe}; gpudoctor writes only regular files of its own")
        if self.holes:
            out.append(f"{self.name}: {plural(self.holes, 'line')} broken by a hole of a sparse file skipped "
                       f"({self.holey}; gpudoctor never writes one)")
        if self.cut is not None:
            out.append(f"{self.name}: read only up to {self.cut}; the rest of it was skipped, and this report "
                       "covers what was read")
        if self.long_lines:
            out.append(f"{self.name}: {plural(self.long_lines, 'line')} over the {self.max_line // 2**20} MiB line cap "
                       "skipped (gpudoctor never writes one; the file is damaged or not gpudoctor's)")
        return out


def folder_owner(path: Path) -> int | None:
    """The uid owning ``path``'s folder: whose files a reader there may trust (or None)."""
    try:
        return os.stat(path.parent).st_uid
    except OSError:
        return None


def open_recording_file(path: Path, issues: ReadIssues) -> IO[bytes] | None:
    """``path`` opened safely (owned by us or by its folder's owner), else None with the reason noted.

    A missing file is None with nothing noted; a link, FIFO, device or stranger's file is noted.
    """
    issues.name = issues.name or f"{_folder_name(path.parent)}/{path.name}"
    try:
        fh = open_read(path, owner=folder_owner(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        issues.unsafe = _reason(path, exc)
        return None
    st = os.fstat(fh.fileno())
    issues.owner = st.st_uid
    if is_holey(st):  # read by its data only (_data_reader), never gigabytes of zeros
        issues.holey = f"{_size(st.st_size)} long, {_size(st.st_blocks * 512)} on disk"
    return fh


def _folder_name(folder: Path) -> str:
    """``events``, also for a folder held open (``/proc/self/fd/N``, :func:`safefs.fd_path`)."""
    if is_pinned(folder):
        try:
            return Path(os.readlink(folder)).name
        except OSError:
            pass
    return folder.name


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _reason(path: Path, exc: OSError) -> str:
    text = str(exc) if exc.strerror is None else exc.strerror
    return text.replace(str(path), "it")[:160]


def _line_blocks(fh: IO[bytes], issues: ReadIssues) -> Iterator[list[bytes]]:
    """Whole lines, a block at a time; a line over ``issues.max_line`` is dropped as it streams.

    A sparse file is read by its data only: each hole (a run of NULs no writer of ours leaves)
    is skipped with a seek, and the line it falls in is dropped and counted.
    """
    rest = b""
    skipping = False  # inside an over-long line: drop bytes until its newline
    read = _data_reader(fh) if issues.holey is not None else _plain_reader(fh)
    while True:
        want = _BLOCK_BYTES
        if issues.max_bytes is not None:
            want = min(want, issues.max_bytes - issues.bytes_read)
            if want <= 0:
                if read(1)[0]:  # more than the budget: said, and the partial last line dropped
                    issues.cut = f"{_size(issues.max_bytes)} (the byte budget)"
                    rest = b""
                break
        data, hole = read(want)
        if hole:  # the line the hole is in is damaged: dropped up to its newline
            if not skipping:
                if hole + len(rest) > issues.max_line:
                    issues.long_lines += 1
                else:
                    issues.holes += 1
            rest, skipping = b"", True
        if not data:
            break
        issues.bytes_read += len(data)
        if skipping:
            cut = data.find(b"\n")
            if cut < 0:
                continue
            data, skipping = data[cut + 1 :], False
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        if len(rest) > issues.max_line:
            rest, skipping = b"", True
            issues.long_lines += 1
        over = [line for line in lines if len(line) > issues.max_line]
        if over:
            issues.long_lines += len(over)
            lines = [line for line in lines if len(line) <= issues.max_line]
        yield lines
    if rest:
        yield [rest]


Reader = Callable[[int], tuple[bytes, int]]  # at most n bytes -> (data, length of a hole skipped before it)


def _plain_reader(fh: IO[bytes]) -> Reader:
    return lambda n: (fh.read(n), 0)


def _data_reader(fh: IO[bytes]) -> Reader:
    """Reads of a sparse file's data only (``SEEK_DATA``/``SEEK_HOLE``): its holes cost a seek,
    not a read of zeros, so a 1 TiB file of a few blocks is read in microseconds."""
    fd = fh.fileno()
    pos = 0

    def read(n: int) -> tuple[bytes, int]:
        nonlocal pos
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after pos
            return b"", 0
        hole, pos = start - pos, start
        end = os.lseek(fd, start, os.SEEK_HOLE)
        data = os.pread(fd, max(0, min(n, end - start)), start)
        pos += len(data)
        return data, hole

    return read


def iter_chunks(path: Path, issues: ReadIssues | None = None) -> Generator[list[Any], None, None]:
    """The lines of ``path`` parsed, a block at a time (``_BAD`` for unreadable lines).

    A missing file is empty; one that cannot be read (a folder, an I/O error) is one bad line,
    and so is one refused as unsafe (the reason in ``issues``).
    """
    issues = issues if issues is not None else ReadIssues()
    fh = open_recording_file(path, issues)
    if fh is None:
        if issues.unsafe is not None:
            yield [_BAD]
        return
    try:
        with fh:
            for lines in _line_blocks(fh, issues):
                yield parse_lines(lines)
    except OSError:
        yield [_BAD]


def iter_jsonl(path: Path, issues: ReadIssues | None = None) -> Iterator[Any]:
    """Every line of ``path`` parsed (``_BAD`` for unreadable ones); nothing if it is missing."""
    for objs in iter_chunks(path, issues):
        yield from objs


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Read a JSON-lines file; return (rows, number of unreadable lines)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    for obj in iter_jsonl(path):
        if type(obj) is dict:
            rows.append(obj)
        else:
            bad += 1
    return rows, bad


def _sampled_lines(fh: IO[bytes], size: int, n: int, issues: ReadIssues) -> list[bytes]:
    """About ``n`` whole lines at evenly spaced offsets, in file order, plus the last ones."""
    cap = issues.max_line
    lines: list[bytes] = []
    last_start = -1
    reached = 0  # a line start: where the last line read (or skipped) ended
    held = 0
    for i in range(n):
        offset = i * size // n
        if offset <= reached:  # inside what was read already: a long line is never scanned twice
            fh.seek(reached)
        else:
            fh.seek(offset)
            _skip_line(fh, cap)  # the rest of the line we landed in
        start = fh.tell()
        if start <= last_start:
            continue
        line = fh.readline(cap + 1)
        if len(line) > cap:
            issues.long_lines += 1
            _skip_line(fh, cap)
            last_start = start
        elif line.endswith(b"\n"):
            held += len(line)
            if held > MAX_SAMPLE_BYTES:  # 2,000 lines just under the line cap would be 8 GB
                issues.cut = f"{_size(MAX_SAMPLE_BYTES)} of sampled lines (the byte budget)"
                break
            lines.append(line)
            last_start = start
        reached = fh.tell()
    tail_offset = max(0, size - 2**20)
    fh.seek(tail_offset)
    parts = fh.read(2**20).split(b"\n")
    whole = parts[1:-1] if tail_offset else parts[:-1]
    if whole and (not lines or lines[-1].rstrip(b"\n") != whole[-1]):
        lines.append(whole[-1])  # the last complete row: the run's last sampled moment
    if parts[-1].strip():
        lines.append(parts[-1])  # a truncated last line: counted as unreadable, as in a full read
    return lines


def _skip_line(fh: IO[bytes], cap: int) -> None:
    """Read past the next newline, ``cap`` bytes at a time (never a whole long line in memory)."""
    while True:
        part = fh.readline(cap)
        if not part or part.endswith(b"\n"):
            return


def read_samples(
    path: Path, clean: Callable[[Any], dict[str, Any] | None], max_rows: int = MAX_SAMPLE_ROWS,
    notes: list[str] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Rows of a sample file that pass ``clean`` (evenly downsampled if the file is large);
    returns (rows, number of unreadable or invalid lines among those read).

    What was refused (an unsafe file, over-long lines) is also told in ``notes``, when given.
    """
    issues = ReadIssues()
    rows: list[dict[str, Any]] = []
    bad = 0
    kept = 0  # memory of the rows kept (kept_bytes): 16 MiB of ``{"t":1}`` rows would be 400 MB
    fh = open_recording_file(path, issues)
    if fh is not None:
        with fh:
            for obj in _sample_objs(fh, max_rows, issues):
                row = clean(obj) if obj is not _BAD else None
                if row is None:
                    bad += 1
                    continue
                kept += kept_bytes(row)
                if kept > MAX_SAMPLE_KEPT_BYTES:
                    issues.cut = f"{_size(MAX_SAMPLE_KEPT_BYTES)} of memory for its rows (the memory budget)"
                    break
                rows.append(row)
        rows.sort(key=lambda r: r["t"])
    if notes is not None:
        notes += issues.notes
    return rows, bad + issues.bad


def _sample_objs(fh: IO[bytes], max_rows: int, issues: ReadIssues) -> Iterator[Any]:
    try:
        size = os.fstat(fh.fileno()).st_size
        if size <= FULL_READ_BYTES or issues.holey is not None:  # a sparse one: its data, by blocks
            issues.max_bytes = FULL_READ_BYTES  # what a full read takes at most
            for lines in _line_blocks(fh, issues):
                yield from parse_lines(lines)
        else:
            yield from parse_lines(_sampled_lines(fh, size, max_rows, issues))
    except OSError:
        yield _BAD


@dataclass
class EventLoad:
    """The events of one process, checked and typed (:class:`Records`), with their time extent."""

    records: Records = field(default_factory=Records)  # a typed collection per kind, steps and spans compact
    bad: int = 0
    t_min: float | None = None
    t_max: float | None = None
    notes: list[str] = field(default_factory=list)  # a refused file, over-long lines (ReadIssues)
    owner: int | None = None  # the file's owner (from its descriptor): whose process wrote it
    kept_lines: int = 0  # lines kept (steps and spans included)
    kept_bytes: int = 0  # their memory as charged to the budget (kept_bytes)

    @property
    def loop(self) -> LoopData:
        return self.records.loop


def read_events(path: Path, max_line: int = MAX_LINE_BYTES, budget: Budget | None = None,
                clock: ClockSteps | None = None) -> EventLoad:
    """Load ``events/<pid>.jsonl``: valid events kept, bad ones counted, counters summed.

    Within ``budget`` (the folder's, shared by its files; a fresh one when None) and the
    per-file caps: what is beyond them is skipped and said in ``notes``. ``clock``: the
    recording's wall-clock steps, taken out of every time on the way in.
    """
    fix = clock.fix if clock else None
    out = EventLoad()
    budget = budget if budget is not None else Budget()
    issues = ReadIssues(max_line=max_line, max_bytes=max(0, min(MAX_EVENT_FILE_BYTES, budget.bytes_left)))
    spent = budget.memory_left <= 0  # by the files before: this one is not read at all
    if spent:
        issues.max_bytes = 0
    lines_left = max(0, min(MAX_EVENTS_PER_FILE, budget.events_left))
    lines = 0
    kept = 0  # bytes of memory kept (kept_bytes), against budget.memory_left
    unknown: dict[str, int] = {}  # lines of kinds this version does not read, by kind (a few named)
    records = out.records
    steps, spans, span_s = records.loop.steps, records.loop.spans, records.loop.span_s
    kept_lines = 0
    times: list[float] = []
    chunks = iter_chunks(path, issues)
    for objs in chunks:
        if lines + len(objs) > lines_left:
            objs = objs[: lines_left - lines]
            issues.cut = f"{lines_left:,} lines (the line budget)"
        lines += len(objs)
        for e in objs:
            # The kinds that make most of a long run: validate's fast checks, then the generic one.
            if type(e) is dict:
                k = e.get("k")
                if k == "step":
                    if fast_step(e):
                        steps.append(fix(e["t"]) if fix else e["t"])
                        kept += STEP_BYTES
                        dt = e.get("dt")
                        if type(dt) is float and dt > 0:
                            records.loop.step_dt_s += dt
                        kept_lines += 1
                        continue
                elif k == "span":
                    if fast_span(e):
                        t0, dt, c, name = e["t0"], e["dt"], e["c"], e.get("name", "?")
                        if fix:
                            t0 = fix(t0)
                        intervals = spans.get(c)
                        if intervals is None:
                            spans[c] = intervals = []
                            span_s[c] = {}
                            kept += NAME_BYTES + len(c)
                        intervals.append((t0, t0 + dt))
                        per = span_s[c]
                        so_far = per.get(name)
                        if so_far is None:
                            so_far = 0.0
                            kept += NAME_BYTES + len(name)
                        per[name] = so_far + dt
                        kept += SPAN_BYTES
                        if name == NO_BATCH_WAIT:
                            records.loop.no_batch_waits += 1
                        kept_lines += 1
                        continue
                elif k == "counter" and fast_counter(e):
                    if fix:
                        e["t"] = fix(e["t"])
                    times.append(e["t"])
                    records.add(e)
                    kept += kept_bytes(e)
                    kept_lines += 1
                    continue
                elif k == "batch":
                    _bound_batch(e, budget)
            e = clean_event(e) if e is not _BAD else None
            if e is None:
                out.bad += 1
                continue
            if e["k"] not in KNOWN_KINDS:  # nothing here reads it: counted, not kept
                if len(unknown) < 3 or e["k"] in unknown:
                    unknown[e["k"]] = unknown.get(e["k"], 0) + 1
                else:
                    unknown["..."] = unknown.get("...", 0) + 1
                continue
            if fix:
                for key in TIME_FIELDS.get(e["k"], ()):
                    if is_time(e.get(key)):
                        e[key] = fix(e[key])
            times += [e[key] for key in ("t", "t0") if is_time(e.get(key))]
            records.add(e)  # steps and spans valid, but with ints or odd extras: to the loop as above
            kept += SPAN_BYTES + NAME_BYTES if e["k"] in ("step", "span") else kept_bytes(e)
            kept_lines += 1
        del objs  # before the next block is parsed: one block's objects at a time
        if kept > budget.memory_left and issues.cut is None:
            issues.cut = f"{_size(budget.memory_left)} of memory for what it keeps (the memory budget)"
        if issues.cut is not None:
            chunks.close()  # the file is closed now: nothing more is read
            break
    if spent and issues.cut is not None:  # stopped at byte 0 for the memory the files before kept
        issues.cut = "what the folder's files before it kept in memory (the memory budget)"
    budget.bytes_left -= issues.bytes_read
    budget.events_left -= lines
    budget.memory_left -= kept
    if unknown:
        out.notes.append(_unknown_note(issues.name, unknown))
    out.owner = issues.owner
    if steps:
        times += [min(steps), max(steps)]
    times += [min(iv)[0] for iv in spans.values() if iv]
    if times:
        out.t_min, out.t_max = min(times), max(times)
    records.finish()
    out.kept_lines, out.kept_bytes = kept_lines, kept
    out.bad += issues.long_lines  # a refused file is already one _BAD line
    out.notes = issues.notes + out.notes
    return out


def _unknown_note(name: str, unknown: dict[str, int]) -> str:
    """The lines of kinds this version does not read, skipped: how many, which kinds."""
    count = sum(unknown.values())
    kinds = ", ".join(repr(k[:40]) for k in unknown if k != "...") + (" ..." if "..." in unknown else "")
    return (f"{name}: {count:,} line{'' if count == 1 else 's'} of kinds this version of gpudoctor does not read skipped "
            f"({kinds}; a newer writer's, or not gpudoctor's)")


def _bound_batch(e: dict[str, Any], budget: Budget) -> None:
    """A ``batch`` line's lengths sampled down (exact rows and longest kept), within the folder's
    budget of lengths; beyond it only the exact figures stay."""
    lengths = e.get("lengths")
    if type(lengths) is not list:
        return
    batchlengths.bound(e, max(0, min(batchlengths.MAX_BATCH_LENGTHS, budget.lengths_left)))
    if not e["lengths"] and lengths:
        e.pop("lengths")  # no lengths left in the budget: rows and lengths_max still say the batch
    budget.lengths_left -= len(e.get("lengths") or ())


def read_spans(path: Path, clock: ClockSteps | None = None) -> list[SpanEvent]:
    """Every valid ``span`` of ``events/<pid>.jsonl`` with its name, read again for the tables
    (:class:`LoopData` keeps spans as bare intervals); what validate refuses is left out, as there.
    ``clock``: the recording's wall-clock steps, taken out as :func:`read_events` does."""
    out: list[SpanEvent] = []
    for e in iter_jsonl(path):
        if type(e) is dict and e.get("k") == "span" and (fast_span(e) or clean_event(e) is not None):
            if clock:
                e["t0"] = clock.fix(e["t0"])
            out.append(e)  # type: ignore[arg-type]  # checked: a span's fields, typed as validate checks them
    return out


@dataclass(frozen=True)
class AllocatorSample:
    """One ``cuda_mem`` line: the CUDA caching allocator at a step end, in MiB."""

    t: float
    n: int | None
    allocated_mib: float  # live tensors
    reserved_mib: float  # held by the allocator: live tensors and cached blocks
    peak_mib: float  # the most ever allocated (the training's resets aside)
    total_mib: float | None  # the device's memory, on the first line


def allocator_samples(records: Records) -> list[AllocatorSample]:
    """A process's ``cuda_mem`` lines (checked on load), typed, in time order."""
    out = [AllocatorSample(float(e["t"]), e.get("n"), float(e["allocated_mib"]), float(e["reserved_mib"]),
                           float(e["peak_mib"]), None if (total := e.get("total_mib")) is None else float(total))
           for e in records.cuda_mem]
    return sorted(out, key=lambda s: s.t)
