"""Which processes under the given pid are the training processes to load hooks into.

``gpudoctor attach`` may be pointed at the training script itself, at a
``torchrun`` / ``accelerate launch`` launcher (the ranks are its children), at
a single rank, or at a shell wrapper around Python. Ranks are told apart from
their DataLoader workers by the ``RANK`` environment variable: a worker
inherits its rank's environment, so a rank is a process with ``RANK`` whose
parent has none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from gpudoctor.attach import symbols
from gpudoctor.attach.inject import permission_hint
from gpudoctor.common.errors import UserError
from gpudoctor.common.proctime import started_at
from gpudoctor.processes.proctree import ProcTree

LAUNCHER_SCRIPTS = {"torchrun", "accelerate", "deepspeed"}
LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"}


@dataclass(frozen=True)
class Target:
    pid: int
    rank: int | None
    create_time: float


def patient(pid: int) -> psutil.Process:
    """The process to attach to, or a one-line :class:`UserError`."""
    if pid == os.getpid():
        raise UserError("that is gpudoctor's own pid; pass the pid of the training process")
    try:
        proc = psutil.Process(pid)
        status = proc.status()
    except psutil.NoSuchProcess:
        raise UserError(f"no process with pid {pid}; find the training process with "
                        "'pgrep -af python' or nvidia-smi") from None
    except psutil.AccessDenied:
        raise UserError(permission_hint(pid, "access denied")) from None
    if status == psutil.STATUS_ZOMBIE:
        raise UserError(f"pid {pid} has already exited (zombie); nothing to attach to")
    return proc


_PYTHON_EXES: dict[str, bool] = {}


def is_python(pid: int) -> bool:
    """Does ``pid`` run CPython? Checked once per executable (reading the ELF costs ~50 ms)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except PermissionError as exc:
        raise UserError(permission_hint(pid, str(exc))) from None
    except OSError:
        return False
    if exe not in _PYTHON_EXES:
        try:
            _PYTHON_EXES[exe] = symbols.python_image(pid) is not None
        except PermissionError as exc:
            raise UserError(permission_hint(pid, str(exc))) from None
        except (OSError, symbols.SymbolError):
            return False
    return _PYTHON_EXES[exe]


def environ(pid: int) -> dict[str, str]:
    """``pid``'s environment, or {} where it cannot be read."""
    try:
        env: dict[str, str] = psutil.Process(pid).environ()  # psutil: no stubs
        return env
    except (psutil.Error, OSError):
        return {}


def environ_rank(proc: psutil.Process) -> int | None:
    try:
        value = proc.environ().get("RANK")
    except (psutil.Error, OSError):
        return None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def is_launcher(proc: psutil.Process) -> bool:
    try:
        return launcher_cmdline(proc.cmdline())
    except psutil.Error:
        return False


def launcher_cmdline(argv: list[str]) -> bool:
    """``torchrun ...``, ``python /usr/bin/torchrun ...``, ``python -m torch.distributed.run ...``."""
    head = [os.path.basename(a) for a in argv[:2]]
    if any(h in LAUNCHER_SCRIPTS for h in head):
        return True
    return any(a == "-m" and b in LAUNCHER_MODULES for a, b in zip(argv, argv[1:], strict=False))


def training_targets(root: psutil.Process, procs: ProcTree | None = None) -> list[Target]:
    """The ranks under a launcher, else the root if it runs Python, else the topmost Python descendants.

    ``procs``, a :class:`ProcTree` of ``root`` kept by the caller, saves reading every process on
    the machine when this is asked again and again (a launcher's ranks appear late).
    """
    try:
        tree = procs.refresh() if procs is not None else [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    if not tree:
        return []
    ranks = {p.pid: environ_rank(p) for p in tree}
    if ranks[root.pid] is not None:
        return [_target(root, ranks[root.pid])]
    ranked = [p for p in tree[1:] if ranks.get(p.pid) is not None and ranks.get(_ppid(p)) is None]
    if ranked or is_launcher(root):
        return [_target(p, ranks[p.pid]) for p in ranked]
    if is_python(root.pid):
        return [_target(root, None)]
    return _topmost_python(root)


def _topmost_python(root: psutil.Process) -> list[Target]:
    found: list[Target] = []
    todo = list(_children(root))
    while todo:
        proc = todo.pop(0)
        if is_python(proc.pid):
            found.append(_target(proc, environ_rank(proc)))
        else:
            todo += _children(proc)
    return found


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = proc.children()
        return children
    except psutil.NoSuchProcess:
        return []


def _ppid(proc: psutil.Process) -> int | None:
    try:
        ppid: int = proc.ppid()
        return ppid
    except psutil.NoSuchProcess:
        return None


def _target(proc: psutil.Process, rank: int | None) -> Target:
    return Target(proc.pid, rank, start_time(proc))


def start_time(proc: psutil.Process) -> float:
    """Epoch start of ``proc`` to ~10 ms (common.proctime); psutil's where /proc does not tell."""
    exact = started_at(proc.pid)
    if exact is not None:
        return exact
    try:
        created: float = proc.create_time()
        return created
    except psutil.Error:
        return 0.0


def describe(pid: int) -> dict[str, object]:
    """ppid and rank of a sampled process, for its stack rows."""
    try:
        proc = psutil.Process(pid)
        return {"ppid": proc.ppid(), "rank": environ_rank(proc)}
    except psutil.Error:
        return {"ppid": None, "rank": None}
