"""Host samples over psutil: the training process tree and the machine.

It runs at ~10 Hz beside training on boxes with few cores, so a tick reads only
a few ``/proc`` files per process and computes every rate from deltas it keeps
itself (psutil's ``cpu_percent`` keeps module-global state that another caller
would disturb). The tree is refreshed every ``tree_refresh_s`` by
:class:`gpudoctor.processes.proctree.ProcTree` (only processes new since the last
refresh are read, not every process on the machine); a process that appears
after sampling began is counted from its creation (CPU and I/O counters start
at zero), so workers found late lose nothing. A process that exits loses only
its last partial tick.

Row written by :class:`HostSampler` (one per tick, ``samples/host.jsonl``)::

    {"t": epoch_s,
     "cpu_proc_pct": float,          # tree CPU, 100 = one core busy
     "cpu_main_pct": float | null,   # the root pid alone (torchrun: the launcher)
     "procs": {"<pid>": float|null}, # root and its direct children (ranks / workers)
     "n_procs": int,                 # processes alive in the tree
     "rss_mib": float,               # tree sum (forked workers share pages: an upper bound)
     "read_mib_s": float | null,     # tree storage I/O (io_counters read/write_bytes)
     "write_mib_s": float | null,
     "n_cpus": int,
     "cpu_percore_pct": [float],     # 100 = that core busy
     "cpu_total_pct": float,         # 100 = every core busy
     "iowait_pct": float | null,     # share of all CPU time in iowait (Linux only)
     "disk_read_mib_s": float | null,  # whole machine, physical disks
     "disk_write_mib_s": float | null,
     "mem_available_mib": float,
     "others": [{"name": str, "pct": float}]}  # every OTHERS_EVERY_S only: the busiest programs
                                     # outside the tree (command name, 100 = one core), >= 10%
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psutil

from gpudoctor.common.proctime import started_at
from gpudoctor.processes.proctree import ProcTree
from gpudoctor.samplers.base import RowWriter, Sampler

_MIB = 1024 * 1024
_CORES = os.cpu_count() or 1  # no process tree runs on more cores than the machine has
OTHERS_EVERY_S = 3.0  # a scan of every process on the machine: rare, not at the 10 Hz tick
OTHERS_MIN_PCT = 10.0  # a program under a tenth of a core is not what takes the run's cores
OTHERS_TOP = 5


@dataclass
class _Tracked:
    """A tree process with its counters at the previous tick (None: not yet known)."""

    proc: psutil.Process
    ppid: int | None
    cpu_s: float | None
    io_bytes: tuple[int, int] | None
    # when a process counted from zero was born (wall clock), until its first tick: the tree is
    # re-listed every few ticks, so its CPU can span more than one interval
    born: float | None = None


class HostSampler(Sampler):
    """Samples the process tree under ``root_pid`` and the host, every ``interval_s``."""

    name = "host"
    keeps_turn = True  # its memory and other-programs rows are levels: a tick skipped is a point lost

    def __init__(
        self,
        root_pid: int,
        writer: RowWriter | None,
        interval_s: float = 0.1,
        tree_refresh_s: float = 1.0,
    ) -> None:
        super().__init__(writer, interval_s)
        self.root_pid = root_pid
        self.tree_refresh_s = tree_refresh_s
        self._tracked: dict[int, _Tracked] = {}
        self._tree_pids: frozenset[int] = frozenset()
        self._watch_since = time.time()
        self._last_scan = float("-inf")
        self._prev_mono = time.monotonic()
        self._prev_cpu = psutil.cpu_times(percpu=True)
        self._prev_disk = self._disk_counters()
        self.tree = ProcTree(root_pid)
        self._others_cpu: dict[tuple[int, float], float] = {}  # (pid, create time) -> CPU s at the last scan
        self._others_at = float("-inf")
        self._refresh_tree(prime=True)
        self._other_programs(time.monotonic())  # the baseline: the first row with ``others`` comes a scan later
        self._tree_counters(dt=None)  # baseline for the first tick's rates

    def pids(self) -> set[int]:
        """The tree's pids at the last scan (safe to call from another thread)."""
        return set(self._tree_pids)

    def sample(self) -> dict[str, Any] | None:
        now = time.monotonic()
        dt = now - self._prev_mono
        self._prev_mono = now
        if dt <= 0:
            return None
        if now - self._last_scan >= self.tree_refresh_s:
            self._refresh_tree(prime=False)
        row = self._tree_counters(dt)
        row.update(self._cpu_row())
        row.update(self._disk_row(dt))
        row["mem_available_mib"] = round(psutil.virtual_memory().available / _MIB, 1)
        if now - self._others_at >= OTHERS_EVERY_S:
            others = self._other_programs(now)
            if others is not None:
                row["others"] = others
        if self.pace is not None:  # a host with no core idle is sampled less often (samplers.pace)
            self.pace.tell_host(row.get("cpu_total_pct"), row.get("n_cpus"))
        return row

    # -- the process tree -----------------------------------------------------

    def _refresh_tree(self, prime: bool) -> None:
        """Re-list the tree; keep counters of known pids, start new ones at zero."""
        self._last_scan = time.monotonic()
        procs = self.tree.refresh()
        tracked: dict[int, _Tracked] = {}
        for proc in procs:
            old = self._tracked.get(proc.pid)
            if old is not None and old.proc == proc:  # same pid and create time
                tracked[proc.pid] = old
                continue
            try:
                ppid = proc.ppid()
                born = started_at(proc.pid) or proc.create_time()  # psutil's reads up to 1 s early
                born_after_start = born >= self._watch_since
            except psutil.NoSuchProcess:
                continue
            start_at_zero = born_after_start and not prime
            tracked[proc.pid] = _Tracked(
                proc, ppid, 0.0 if start_at_zero else None, (0, 0) if start_at_zero else None,
                born if start_at_zero else None,
            )
        self._tracked = tracked
        self._tree_pids = frozenset(tracked)

    def _tree_counters(self, dt: float | None) -> dict[str, Any]:
        cpu_pct: dict[int, float | None] = {}
        alive: list[int] = []
        rss = io_read = io_write = 0
        io_seen = False
        for pid, tr in list(self._tracked.items()):
            try:
                cpu_s, proc_rss, io, zombie = _read_counters(tr.proc)
            except psutil.NoSuchProcess:
                del self._tracked[pid]
                continue
            except psutil.AccessDenied as exc:  # another user's process: say so, skip it
                self._record_error(exc)
                continue
            # a zombie's last tick counts; a newcomer's CPU since its birth, which may be before this tick's
            # interval; at most every core busy (a short interval reads CPU time in whole clock ticks)
            span = max(dt or 0.0, time.time() - tr.born) if tr.born is not None else dt
            rate = _rate(cpu_s, tr.cpu_s, span, 100.0)
            cpu_pct[pid] = min(rate, 100.0 * _CORES) if rate is not None else None
            tr.cpu_s, tr.born = cpu_s, None
            if zombie:  # exited, not yet reaped: not a live process any more
                del self._tracked[pid]
                continue
            alive.append(pid)
            rss += proc_rss
            if io is not None and tr.io_bytes is not None:
                io_read += io[0] - tr.io_bytes[0]
                io_write += io[1] - tr.io_bytes[1]
                io_seen = True
            tr.io_bytes = io if io is not None else tr.io_bytes
        top = {
            str(pid): _round(cpu_pct[pid])
            for pid in alive
            if pid == self.root_pid or self._tracked[pid].ppid == self.root_pid
        }
        return {
            "cpu_proc_pct": round(min(100.0 * _CORES, sum(p for p in cpu_pct.values() if p is not None)), 1),
            "cpu_main_pct": _round(cpu_pct.get(self.root_pid)) if self.root_pid in alive else None,
            "procs": top,
            "n_procs": len(alive),
            "rss_mib": round(rss / _MIB, 1),
            "read_mib_s": round(io_read / _MIB / dt, 3) if io_seen and dt else None,
            "write_mib_s": round(io_write / _MIB / dt, 3) if io_seen and dt else None,
        }

    # -- other programs -----------------------------------------------------------

    def _other_programs(self, now: float) -> list[dict[str, Any]] | None:
        """The programs outside the tree (and outside this doctor) that kept cores busy since the
        last scan, by command name (``comm``: never the command line, which can hold secrets),
        busiest first. None on the first scan (no interval yet)."""
        mine = {os.getpid(), *self._tree_pids}
        cpu: dict[tuple[int, float], float] = {}
        names: dict[tuple[int, float], str] = {}
        for pid, name, cpu_s, started in _proc_stats(mine):
            cpu[(pid, started)] = cpu_s
            # another user's doctor (or another run's) is not this one's cost: name it apart, by pid
            names[(pid, started)] = f"another gpudoctor (pid {pid})" if name == "gpudoctor" else name
        prev, self._others_cpu = self._others_cpu, cpu
        dt, self._others_at = now - self._others_at, now
        if not prev or dt <= 0:
            return None
        per_name: dict[str, float] = {}
        for key, cpu_s in cpu.items():
            base = prev.get(key, 0.0)  # not there last scan: started since, all its CPU is new

            per_name[names[key]] = per_name.get(names[key], 0.0) + max(0.0, cpu_s - base) * 100.0 / dt
        busy = sorted(((pct, name) for name, pct in per_name.items() if pct >= OTHERS_MIN_PCT), reverse=True)
        return [{"name": name, "pct": round(pct, 1)} for pct, name in busy[:OTHERS_TOP]]

    # -- the machine --------------------------------------------------------------

    def _cpu_row(self) -> dict[str, Any]:
        """Per-core and total busy %, as psutil.cpu_percent counts them, plus iowait."""
        cur = psutil.cpu_times(percpu=True)
        prev, self._prev_cpu = self._prev_cpu, cur
        pairs = list(zip(prev, cur, strict=False))
        total_d = sum(_total(b) - _total(a) for a, b in pairs)
        idle_d = sum(_idle(b) - _idle(a) for a, b in pairs)
        iowait_pct = None
        if cur and hasattr(cur[0], "iowait"):
            iowait_d = sum(b.iowait - a.iowait for a, b in pairs)
            iowait_pct = _share_pct(iowait_d, total_d)
        return {
            "n_cpus": len(cur),
            "cpu_percore_pct": [_busy_pct(a, b) for a, b in pairs],
            "cpu_total_pct": _share_pct(total_d - idle_d, total_d),
            "iowait_pct": iowait_pct,
        }

    def _disk_row(self, dt: float) -> dict[str, Any]:
        cur = self._disk_counters()
        prev, self._prev_disk = self._prev_disk, cur
        if cur is None or prev is None:
            return {"disk_read_mib_s": None, "disk_write_mib_s": None}
        return {
            "disk_read_mib_s": round((cur.read_bytes - prev.read_bytes) / _MIB / dt, 3),
            "disk_write_mib_s": round((cur.write_bytes - prev.write_bytes) / _MIB / dt, 3),
        }

    def _disk_counters(self) -> Any:
        """Whole-machine disk counters, or None where the host hides them (containers)."""
        try:
            return psutil.disk_io_counters()
        except (OSError, RuntimeError) as exc:
            self._record_error(exc)
            return None


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stats(skip: set[int]) -> list[tuple[int, str, float, float]]:
    """(pid, command name, CPU seconds, start in clock ticks since boot) of every process but
    ``skip``, from one read of ``/proc/<pid>/stat`` each (psutil's iterator costs ~10x more); []
    where there is no ``/proc``."""
    out: list[tuple[int, str, float, float]] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid in skip:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                raw = fh.read(1024)
        except OSError:
            continue
        left, right = raw.find(b"("), raw.rfind(b")")
        fields = raw[right + 2:].split()
        if left < 0 or right < 0 or len(fields) < 20:
            continue
        name = raw[left + 1:right].decode("utf-8", "replace")[:40]
        out.append((pid, name, (int(fields[11]) + int(fields[12])) / _TICK, float(fields[19])))
    return out


def _read_counters(proc: psutil.Process) -> tuple[float, int, tuple[int, int] | None, bool]:
    """CPU seconds, RSS bytes, storage I/O bytes and whether it has exited (a zombie, or exiting), in one pass."""
    with proc.oneshot():
        zombie = proc.status() == psutil.STATUS_ZOMBIE
        times = proc.cpu_times()
        rss = 0 if zombie else proc.memory_info().rss
        if rss == 0:  # a zombie, or exiting with its memory already released (a live process has pages)
            return times.user + times.system, 0, None, True
        return times.user + times.system, rss, _io_bytes(proc), False


def _io_bytes(proc: psutil.Process) -> tuple[int, int] | None:
    """Storage bytes read/written; None where the OS or permissions do not tell."""
    try:
        io = proc.io_counters()
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        return None
    return io.read_bytes, io.write_bytes


def _rate(cur: float, prev: float | None, dt: float | None, scale: float) -> float | None:
    if prev is None or not dt:
        return None
    return max(0.0, (cur - prev) * scale / dt)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _total(t: Any) -> float:
    """Total CPU time; guest time is already inside user time on Linux."""
    total: float = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # psutil: no stubs
    return total


def _idle(t: Any) -> float:
    idle: float = t.idle + getattr(t, "iowait", 0.0)  # psutil: no stubs
    return idle


def _busy_pct(prev: Any, cur: Any) -> float:
    total_d = _total(cur) - _total(prev)
    return _share_pct(total_d - (_idle(cur) - _idle(prev)), total_d)


def _share_pct(part: float, whole: float) -> float:
    """``part`` as a % of ``whole``, clamped to 0..100 (counters tick unevenly)."""
    if whole <= 0:
        return 0.0
    return round(min(100.0, max(0.0, 100.0 * part / whole)), 1)
