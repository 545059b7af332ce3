"""A process and its descendants, kept up to date by reading only the processes that are new.

Why not ``psutil.Process.children(recursive=True)`` on every refresh: it reads
``/proc/<pid>/stat`` of every process on the machine (~1.3 ms for 70 processes
here, tens of ms on a many-core host with its kernel threads), and the samplers
refresh their tree every second beside a training that may keep every core
busy. A process outside the tree never joins it later (a parent is only ever
replaced by a reaper, never by a tree member), so only pids that were not
listed last time need reading: one ``/proc`` listing plus a ``stat`` per new
process. A full rescan every :data:`FULL_RESCAN_S` catches what that cannot see
(a pid freed and reused between two listings, a process whose parent died and
was reparented out of the tree).
"""

from __future__ import annotations

import os
import time

import psutil

FULL_RESCAN_S = 30.0
_PROC = "/proc"


class ProcTree:
    """``root_pid`` and its descendants; :meth:`refresh` returns them, the root first."""

    def __init__(self, root_pid: int, full_rescan_s: float = FULL_RESCAN_S) -> None:
        self.full_rescan_s = full_rescan_s
        try:  # kept, so a reused pid after the root exits is not mistaken for it
            self.root: psutil.Process | None = psutil.Process(root_pid)
        except psutil.NoSuchProcess:
            self.root = None
        self._members: dict[int, psutil.Process] = {}
        self._listed: set[int] = set()
        self._next_full = 0.0
        self.stats_read = 0  # ``/proc/<pid>/stat`` reads for parentage, all refreshes (tests count them)

    def refresh(self) -> list[psutil.Process]:
        """The tree now: the root first, then descendants; empty once the root is gone."""
        root = self.root
        if root is None or not root.is_running():
            self._members.clear()
            return []
        listed = _listing()
        now = time.monotonic()
        if listed is None or now >= self._next_full:
            self._next_full = now + self.full_rescan_s
            self._full(root, listed)
        else:
            self._incremental(root, listed)
        if listed is not None:
            self._listed = listed
        return [root, *(p for pid, p in self._members.items() if pid != root.pid)]

    def _full(self, root: psutil.Process, listed: set[int] | None) -> None:
        try:
            children = root.children(recursive=True)  # reads every process's parent
        except psutil.NoSuchProcess:
            children = []
        self.stats_read += len(listed) if listed is not None else len(children)
        self._members = {root.pid: root, **{p.pid: p for p in children}}

    def _incremental(self, root: psutil.Process, listed: set[int]) -> None:
        # A member missing from the listing has left unless it still runs (same pid and start time): a
        # host row once lacked a live DataLoader worker, a third of the tree's memory, for one tick.
        members = {pid: p for pid, p in self._members.items() if pid in listed or _running(p)}
        members[root.pid] = root
        parents: dict[int, tuple[int, psutil.Process]] = {}
        for pid in listed - self._listed:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    parents[pid] = (proc.ppid(), proc)
            except psutil.Error:  # gone already, or not ours to read: not a member we can sample
                continue
            finally:
                self.stats_read += 1
        added = True
        while added:  # a new worker's own new children: parents first, in any pid order
            added = False
            for pid, (ppid, proc) in list(parents.items()):
                if ppid in members:
                    members[pid] = proc
                    del parents[pid]
                    added = True
        self._members = members


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running())
    except psutil.Error:
        return False


def _listing() -> set[int] | None:
    """Every pid on the machine (one directory read), or None where there is no ``/proc``."""
    try:
        with os.scandir(_PROC) as entries:
            return {int(e.name) for e in entries if e.name.isdigit()}
    except OSError:
        return None
