"""Is this a moment when a debugger stop cannot break the patient?

gdb stops every thread of the process it attaches to. On Linux a stop makes a
socket call that has a timeout (``SO_RCVTIMEO``/``SO_SNDTIMEO``) fail with
``EINTR`` instead of resuming, and PyTorch's c10d ``TCPStore`` client treats
that as a dead connection: a rank stopped while it talks to the rendezvous store
(``init_process_group``, ``new_group``, a store barrier) raises
``DistNetworkError`` and the whole job goes down. Seen in CI, reproduced by
stopping a process inside ``TCPStore.get``.

So before gdb attaches, this module looks at the patient from outside, without
stopping it:

* ``/proc/<pid>/task/*/syscall``: no thread may be blocked in a socket call, or
  a ``poll`` (the store client polls before each receive), on a TCP connection
  to the store (waited for as long as it takes), nor on
  another TCP connection (code in C may not retry after ``EINTR``; Python's own
  sockets retry, PEP 475). The second is waited out for a few seconds only: a
  socket with no timeout resumes after a stop, and one blocked that long
  usually has none;
* for a distributed rank, its main thread's Python stack (``py-spy dump
  --nonblocking``) must be outside rendezvous and process-group creation, where
  store calls follow each other too fast for the first check to catch, and the
  rank must have its store connection already (before it, it may enter the
  rendezvous any moment, inside gdb's own start-up time; waited for 30 s at
  most, since a rank that never connects does not use the store). A rank is
  stopped only after two clear looks in a row.

Training itself is safe to stop: gloo and NCCL wait in ``epoll_wait``/futexes,
which resume or retry. The checks only delay the injection; they never stop the
patient.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.attach.stacks import pyspy_path
from gpudoctor.processes import childpy

# Socket system calls that fail with EINTR after a stop when the socket has a timeout.
# Their first argument is the file descriptor.
_SOCKET_CALLS = {
    "x86_64": {0: "read", 1: "write", 42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom",
               46: "sendmsg", 47: "recvmsg", 288: "accept4", 299: "recvmmsg", 307: "sendmmsg"},
    "aarch64": {63: "read", 64: "write", 202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom",
                211: "sendmsg", 212: "recvmsg", 242: "accept4", 243: "recvmmsg", 269: "sendmmsg"},
}
# Waits on a pollfd array (first argument) of n entries (second): c10d's store client polls its
# socket with a timeout before each recv. A stop fails them with EINTR too.
_POLL_CALLS = {"x86_64": {7: "poll", 271: "ppoll"}, "aarch64": {73: "ppoll"}}
_MAX_POLL_FDS = 64
# Main-thread frames that mean "talking to the store": torch.distributed's rendezvous and group set-up.
_RENDEZVOUS_FILES = ("torch/distributed/rendezvous.py", "torch/distributed/elastic/")
_RENDEZVOUS_NAMES = ("init_process_group", "new_group", "new_subgroups", "_store_based_barrier", "rendezvous",
                     "init_device_mesh", "_create_c10d_store", "monitored_barrier")
_TCP_STATES = {"01": "established", "02": "connecting", "03": "connecting"}  # /proc/net/tcp's st column

SOFT_WAIT_S = 5.0  # a C thread blocked on some other TCP connection: waited out this long, then stopped anyway
UNCONNECTED_WAIT_S = 30.0  # a rank that never connects to the store does not use it
POLL_S = 0.1
CLEAR_CHECKS = 2  # consecutive clear looks at a rank before it is stopped


@dataclass(frozen=True)
class Hazard:
    """What makes a stop unsafe now, and how long to wait for it to pass (None: as long as it takes)."""

    reason: str
    max_wait_s: float | None


@dataclass(frozen=True)
class Distributed:
    """A torch.distributed rank's store address, from its environment (set by torchrun / accelerate)."""

    master_port: int | None


def distributed(environ: dict[str, str]) -> Distributed | None:
    """The rank's store, or None for a process that is not a torch.distributed rank."""
    if "WORLD_SIZE" not in environ and "TORCHELASTIC_RUN_ID" not in environ:
        return None
    try:
        port: int | None = int(environ["MASTER_PORT"])
    except (KeyError, ValueError):
        port = None
    return Distributed(port)


def wait_until_stoppable(pid: int, dist: Distributed | None, give_up: threading.Event,
                         on_wait: Callable[[Hazard], None] | None = None) -> Hazard | None:
    """Block until a stop is safe (None), or return the hazard that lasted until ``give_up`` or the exit.

    ``on_wait`` hears each hazard that holds the stop back (for the live view).
    """
    first_seen: dict[str, float] = {}
    clear = 0
    needed = CLEAR_CHECKS if dist is not None else 1
    while True:
        hazard = why_not_now(pid, dist)
        now = time.monotonic()
        if hazard is None or (hazard.max_wait_s is not None
                              and now - first_seen.setdefault(hazard.reason, now) >= hazard.max_wait_s):
            clear += 1
            if clear >= needed:
                return None
        else:
            clear = 0
            if on_wait is not None:
                on_wait(hazard)
        if give_up.wait(POLL_S):
            return hazard or Hazard("it was not yet seen clear twice", None)
        if not os.path.exists(f"/proc/{pid}"):
            return Hazard("it exited", None)


def why_not_now(pid: int, dist: Distributed | None) -> Hazard | None:
    """Why a debugger stop could break ``pid`` right now; None when it is safe (as far as can be seen)."""
    sockets = _tcp_sockets(pid)
    store = dist.master_port if dist is not None else None
    busy = _blocked_on_tcp(pid, sockets)
    if busy is not None:
        reason, port = busy
        return Hazard(reason, None if port == store else SOFT_WAIT_S)
    if dist is None:
        return None
    if store is not None and (store, "established") not in sockets.values():
        return Hazard("it has not connected to the rendezvous store yet", UNCONNECTED_WAIT_S)
    where = _in_rendezvous(pid)
    return Hazard(where, None) if where else None


def _tcp_sockets(pid: int) -> dict[int, tuple[int, str]]:
    """File descriptor -> (remote port, state) for ``pid``'s TCP sockets.

    ``/proc/<pid>/net/tcp`` lists the whole network namespace (the launcher's and the other
    ranks' connections too): only the socket inodes among ``pid``'s descriptors are its own.
    """
    fds: dict[int, int] = {}  # inode -> fd
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            fds[int(link[len("socket:["):-1])] = int(name)
    found: dict[int, tuple[int, str]] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            try:
                fd = fds.get(int(cols[9]))
                if fd is not None:
                    found[fd] = (int(cols[2].rsplit(":", 1)[1], 16), _TCP_STATES.get(cols[3], "other"))
            except (ValueError, IndexError):
                continue
    return found


def _blocked_on_tcp(pid: int, sockets: dict[int, tuple[int, str]]) -> tuple[str, int] | None:
    """A thread blocked in a socket call or a poll on one of ``pid``'s TCP ``sockets`` (by fd):
    what it waits in, and the remote port."""
    if not sockets:
        return None
    arch = platform.machine()
    calls, polls = _SOCKET_CALLS.get(arch, {}), _POLL_CALLS.get(arch, {})
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None  # gone, or not ours to read: the injection itself will say so
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall", encoding="ascii") as fh:
                fields = fh.read().split()
            nr, args = int(fields[0]), [int(a, 16) for a in fields[1:4]]
        except (OSError, ValueError, IndexError):
            continue  # "running", or already gone
        if nr in calls:
            fds, name = [args[0]], calls[nr]
        elif nr in polls:
            fds, name = _pollfds(pid, args[0], args[1]), polls[nr]
        else:
            continue  # blocked in something that resumes after a stop (futex, epoll_wait, ...)
        for fd in fds:
            if fd in sockets:
                port, state = sockets[fd]
                return f"thread {tid} waits in {name}() on a TCP connection to port {port} ({state})", port
    return None


def _pollfds(pid: int, address: int, count: int) -> list[int]:
    """The descriptors of a ``struct pollfd[count]`` in ``pid``'s memory (read, never stopped)."""
    if not 0 < count <= _MAX_POLL_FDS:
        return []
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as fh:
            fh.seek(address)
            raw = fh.read(8 * count)
    except (OSError, OverflowError, ValueError):
        return []
    return [int.from_bytes(raw[i:i + 4], "little", signed=True) for i in range(0, len(raw) - 7, 8)]


def _in_rendezvous(pid: int) -> str | None:
    """The main thread's frame inside rendezvous / group creation, from a non-stopping py-spy dump."""
    exe = pyspy_path()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "dump", "--nonblocking", "--json", "--pid", str(pid)],
                             capture_output=True, text=True, timeout=10, env=childpy.doctor_env())
        threads = json.loads(out.stdout) if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
    for thread in threads:
        if thread.get("os_thread_id") != pid:
            continue
        for frame in thread.get("frames", []):
            path = str(frame.get("filename", "")).replace("\\", "/")
            name = str(frame.get("name", ""))
            if "torch/distributed/" in path and (any(f in path for f in _RENDEZVOUS_FILES)
                                                 or name in _RENDEZVOUS_NAMES):
                return f"its main thread is in torch.distributed's {name}()"
    return None
