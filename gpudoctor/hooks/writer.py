"""Per-process event writer used by the in-process hooks.

The hot path (one call per batch or step) only appends a dict to a list;
JSON encoding and the write happen on a flush thread every ``flush_s`` while
events come, so a SIGKILL loses at most that much. With only counters to write
it sleeps until they are due (an event wakes it): an old DataLoader worker,
which only counts, wakes every 10 s rather than twice a second. Fork-safe: a
forked DataLoader worker starts with an empty buffer and its own ``events/<pid>.jsonl``,
and writes what is left when it exits (through multiprocessing's exit, since ``atexit``
never runs in its ``os._exit``).

Counters (tokenizer and fetch time) are two numbers per name in memory; their
lines are written every ``flush_s`` while the process is young and then every
``age / 60`` seconds up to :data:`COUNTER_MAX_PERIOD_S`, so a kill loses at most
~2% of their totals while a day-long DataLoader worker writes ~17k lines, not
~350k (which is what kept day-long reports slow). The first step cuts them, so
"tokenized before / after the first step" stays exact. Files are 0600.

The writer is itself a hook body: a flush that fails for any reason but a full
disk goes through :mod:`gpudoctor.hooks.guard` (vital: recording stops, said once).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpudoctor.common import safefs
from gpudoctor.common.proctime import started_at
from gpudoctor.common.redact import redact_argv, redact_mapping
from gpudoctor.core.events import Event
from gpudoctor.hooks.guard import guarded

COUNTER_MAX_PERIOD_S = 10.0


class EventWriter:
    def __init__(self, run_dir: Path, flush_s: float = 0.5) -> None:
        self.run_dir = Path(run_dir)
        self.flush_s = flush_s
        self.enabled = True
        self._reset_state()
        _live.add(self)  # one fork handler for all writers: a registration of its own would keep each forever
        atexit.register(self.close)

    def _reset_state(self) -> None:
        self._pid = os.getpid()
        # Re-entrant: a detach runs on the main thread wherever it is (attach's pending call, a signal),
        # inside cut_counters too, and its final flush takes this lock again: a plain Lock would hang training.
        self._lock = threading.RLock()
        self._buf: list[Mapping[str, Any]] = []
        self._counters: dict[str, list[float]] = {}
        self._fh: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # an event for a flush thread in a long sleep
        self._long = False  # the flush thread sleeps longer than flush_s (nothing but counters to write)
        self._had_events = False  # its last flush wrote events, not only counter lines
        self._announced = False
        self._born = time.monotonic()
        self._counters_due = 0.0  # monotonic time of the next counter lines
        self._cpu_s = 0.0  # the flush thread's own CPU seconds, as of its last flush
        self._written = 0  # events written
        self._held: dict[str, Event] = {}  # events that may still grow (hold/release), by key
        self._not_at_exit: set[str] = set()  # held keys dropped, not written, when the process ends

    # -- hot path -----------------------------------------------------------
    def emit(self, event: Event) -> None:
        if not self.enabled:
            return
        if not self._announced:
            self._announce()
        self._buf.append(event)  # list.append is atomic under the GIL
        if self._long:  # the flush thread sleeps until its counters are due: this cannot wait that long
            self._wake.set()

    def count(self, name: str, seconds: float, cpu_s: float | None = None, thread_cpu_s: float | None = None,
              run_delay_s: float | None = None) -> None:
        """Add one call of ``seconds`` (and, when timed, its process and thread CPU seconds and the
        thread's wait for a core) to a periodically flushed counter."""
        if not self.enabled:
            return
        if not self._announced:
            self._announce()
        slot = self._counters.get(name)
        if slot is None:
            slot = self._counters[name] = [0, 0.0, 0.0, 0.0, 0, 0.0]
        slot[0] += 1
        slot[1] += seconds
        if cpu_s is not None:
            slot[2] += cpu_s
            slot[3] += thread_cpu_s or 0.0
            slot[4] += 1
            slot[5] += run_delay_s or 0.0

    # -- background ---------------------------------------------------------
    def _announce(self) -> None:
        self._announced = True
        try:
            proc = _proc_event()
        except Exception:  # the process's own details are a nicety: the events still need a file
            proc = {"k": "proc", "t": time.time(), "pid": os.getpid(), "ppid": os.getppid()}
        self._buf.append(proc)
        self._thread = threading.Thread(target=self._loop, name="gpudoctor-writer", daemon=True)
        self._thread.start()
        with contextlib.suppress(Exception):  # a nicety: an emit must never raise into the patient
            _close_at_multiprocessing_exit(self)

    def _loop(self) -> None:
        name_thread(b"gd-writer")
        while not self._stop.is_set():
            woken = self._wake.wait(self._sleep_s())
            self._long = False
            if woken:  # an event ended a long sleep: what comes within flush_s goes in the same write
                self._wake.clear()
                if self._stop.wait(self.flush_s):
                    return
            if self._stop.is_set():
                return
            self.flush()
            self._cpu_s = time.thread_time()

    def _sleep_s(self) -> float:
        """flush_s while events come (one wake each, as ever); else until the counters are due."""
        if self._buf or self._had_events:
            return self.flush_s
        sleep = max(0.0, self._counters_due - time.monotonic())
        if sleep > self.flush_s:
            self._long = True  # from here an emit wakes the thread
            if self._buf:  # one came before the flag was up: it was not told
                self._long = False
                return self.flush_s
        return sleep

    def cut_counters(self) -> None:
        """Write the counters' totals so far as lines now (e.g. just before the first step)."""
        with self._lock:
            self._cut_counters()

    def _cut_counters(self) -> None:
        if self._counters:
            now = time.time()
            counters, self._counters = self._counters, {}
            for name, (calls, seconds, cpu, thread_cpu, timed, delay) in counters.items():
                line: dict[str, Any] = {"k": "counter", "t": now, "name": name, "calls": int(calls), "s": seconds}
                if timed == calls:  # CPU beside wall only when every call had it (else the ratio lies)
                    line["cpu"] = cpu
                    line["tcpu"] = thread_cpu
                    line["rdelay"] = delay
                self._buf.append(line)
        mono = time.monotonic()
        self._counters_due = mono + min(COUNTER_MAX_PERIOD_S, max(self.flush_s, (mono - self._born) / 60))

    @guarded("event writer", vital=True)
    def flush(self, final: bool = False) -> None:
        self._flush(final)

    def last_words(self, event: Mapping[str, Any]) -> None:
        """Write ``event`` now and stop recording (a vital hook failed); never raises."""
        self._buf.append(event)
        with contextlib.suppress(Exception):  # the failure itself is already said on stderr
            self._flush(final=True)
        self.enabled = False
        self._stop.set()
        self._wake.set()

    def hold(self, key: str, event: Event, at_exit: bool = True) -> None:
        """Keep ``event`` back, replacing what ``key`` held: a span that may still grow (a save whose
        fsync and rotation follow) is written once, as it finally is, never once per extension.
        ``at_exit=False``: dropped if the process ends before :meth:`release`."""
        if self.enabled:
            if not self._announced:
                self._announce()
            with self._lock:
                self._held[key] = event
                if at_exit:
                    self._not_at_exit.discard(key)
                else:
                    self._not_at_exit.add(key)

    def release(self, key: str) -> None:
        """Write what ``key`` holds (nothing if it holds nothing)."""
        if self._held:
            with self._lock:
                event = self._held.pop(key, None)
            if event is not None:
                self.emit(event)

    def holds(self, key: str) -> bool:
        return key in self._held

    def drop(self, key: str) -> None:
        """Forget what ``key`` holds."""
        if self._held:
            with self._lock:
                self._held.pop(key, None)

    def _flush(self, final: bool) -> None:
        with self._lock:
            if final and self._held:  # the process ends: what was held is final now
                self._buf.extend(e for k, e in self._held.items() if k not in self._not_at_exit)
                self._held.clear()
            self._had_events = bool(self._buf)  # before the counter lines join them
            if final or time.monotonic() >= self._counters_due:
                self._cut_counters()
            if not self._buf:
                return
            events, self._buf = self._buf, []
            self._written += len(events)
            try:
                if self._fh is None:
                    path = self.run_dir / "events" / f"{os.getpid()}.jsonl"
                    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    self._fh = safefs.open_append(path, 0o600)  # never through a planted link or FIFO
                self._fh.write("".join(_ENCODER.encode(e) + "\n" for e in events))
                self._fh.flush()
            except OSError as exc:  # disk full / folder gone: stop recording, never hurt the patient
                self.enabled = False
                self._close_file()
                print(f"gpudoctor: stopped recording in pid {os.getpid()}: {exc}", file=sys.stderr)

    def _close_file(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):  # its unflushed tail is lost, not raised at exit
                fh.close()

    def close(self, exiting: bool = True) -> None:
        """Flush and close; ``exiting=False`` on a detach, where the process runs on."""
        if self._pid != os.getpid():
            return
        if self._announced:
            # what recording cost this process beside its hooks: the flush thread's CPU (bench/ reads it)
            t, cpu_s = time.time(), round(self._cpu_s, 4)
            self.emit({"k": "exit", "t": t, "writer_cpu_s": cpu_s, "events_written": self._written} if exiting
                      else {"k": "detach", "t": t, "writer_cpu_s": cpu_s, "events_written": self._written})
        self._stop.set()
        self._wake.set()
        self.flush(final=True)
        with self._lock:
            self._close_file()
        if not exiting:  # a detached writer has nothing left to do at exit (attach may come back many times)
            atexit.unregister(self.close)


_live: weakref.WeakSet[EventWriter] = weakref.WeakSet()


def _reset_in_child() -> None:
    """A forked child (a DataLoader worker) starts every writer afresh: empty buffer, its own file."""
    for writer in list(_live):
        writer._reset_state()


# Registered once per interpreter: ``os.register_at_fork`` cannot unregister, so a handler per writer
# (attach re-installs on every session) kept every detached writer alive and ran them all at each fork.
os.register_at_fork(after_in_child=_reset_in_child)


def _close_at_multiprocessing_exit(writer: EventWriter) -> None:
    """A multiprocessing child (a DataLoader worker) ends in ``os._exit``, past ``atexit``: without
    this its buffered events and counters since the last write were lost at every worker exit
    (each epoch, without ``persistent_workers``). multiprocessing's own exit function runs its
    finalizers; one is registered here, at the writer's first event in the child (after the child's
    bootstrap cleared the finalizers inherited from the parent), holding the writer weakly."""
    mp = sys.modules.get("multiprocessing")
    util = sys.modules.get("multiprocessing.util")
    if mp is None or util is None or mp.parent_process() is None:
        return  # not a multiprocessing child: atexit runs
    util.Finalize(writer, _close_if_alive, args=(weakref.ref(writer),), exitpriority=100)


def _close_if_alive(ref: weakref.ref[EventWriter]) -> None:
    writer = ref()
    if writer is not None:
        with contextlib.suppress(Exception):  # the child's exit must go on whatever happens here
            writer.close()
        atexit.unregister(writer.close)  # a spawned child also runs atexit: one exit line, not two


def _as_text(value: Any) -> str:
    """JSON's fallback for a value it cannot encode; an object that cannot print is named."""
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


# One encoder for every line: json.dumps with options builds a new one per call (~30% of the flush's CPU)
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_as_text)


def name_thread(name: bytes) -> None:
    """Name the calling thread for the kernel (``/proc/<pid>/task/*/comm``): its CPU can be told apart.

    Not :func:`gpudoctor.processes.priority.name_thread`: this runs in the patient, where importing that
    module would run ``ctypes.util.find_library`` (a subprocess) in the training process.
    """
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _proc_event() -> dict[str, Any]:
    env = os.environ
    create_time = started_at(os.getpid())
    if create_time is None:  # not Linux: psutil's, which may read up to a second early
        try:
            import psutil

            create_time = psutil.Process().create_time()
        except Exception:  # psutil missing in the patient's interpreter: time is still known from samples
            create_time = None
    is_worker = False
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None:
        try:
            is_worker = torch_data.get_worker_info() is not None
        except Exception:
            is_worker = False
    libs = {}
    for name in ("torch", "transformers", "datasets", "accelerate", "tokenizers", "lightning"):
        mod = sys.modules.get(name)
        if mod is not None:
            libs[name] = getattr(mod, "__version__", None)
    return {
        "k": "proc",
        "t": time.time(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "rank": _int_env(env.get("RANK")),
        "local_rank": _int_env(env.get("LOCAL_RANK")),
        "world_size": _int_env(env.get("WORLD_SIZE")),
        "argv": redact_argv([sys.executable, *sys.argv]),
        "create_time": create_time,
        "is_worker": is_worker,
        "libs": redact_mapping(libs),  # a local build's version string can carry anything
        "python": sys.version.split()[0],
    }


def _int_env(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
