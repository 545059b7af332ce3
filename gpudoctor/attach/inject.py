"""Put :mod:`gpudoctor.attach.payload` into a live CPython process.

Python 3.14+ has ``sys.remote_exec``: the doctor's own interpreter (3.14+) or
the patient's, run as the patient's user with ``-I -S``, asks the patient to run
the bootstrap. Older versions get the debugger route ``memray attach`` and
pyrasite use, made gentler:

* the addresses of ``mmap``, ``Py_AddPendingCall`` and ``PyRun_SimpleString``
  are resolved here (:mod:`.symbols`), so gdb attaches with no symbols and the
  patient is stopped for ~30 ms, not the ~0.5 s symbol loading takes;
* gdb only maps a page, writes a short loader for the bootstrap into it and queues
  ``PyRun_SimpleString(page)`` with ``Py_AddPendingCall``. CPython runs it on
  the main thread at the next bytecode boundary, with the GIL, like a signal
  handler: never in the middle of an allocation or a half-built object, which
  is where calling ``PyRun_SimpleString`` from a stopped thread can land;
* the bootstrap swallows every exception (a pending call that fails would raise
  ``SystemError`` in the patient) and reports through a status file instead. It
  looks up no name in ``__main__`` (nanoGPT leaves ``compile = False`` there);
* the doctor may be root beside another user's training: gdb's commands live in
  the doctor's private scratch folder, never in ``attach/`` (the patient's user
  writes there), and nothing of the patient's runs with the doctor's privileges.

Detach needs no debugger: the payload's watchdog removes the hooks when the
doctor creates ``<control>/detach`` or exits.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.attach import budget, gdbcheck, scratch, symbols
from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.processes import childpy, priority

PKG_PARENT = str(childpy.PKG_PARENT)  # the folder holding this gpudoctor, appended to the patient's path
_STATUS_LIMIT = 64 * 1024
_PAGE = 4096
_MAX_SOURCE = 16 * _PAGE
_PROT_RW = 3
_MAP_PRIVATE_ANON = 0x22
_GDB_SETTINGS = (
    "set auto-solib-add off",  # libtorch alone would take gdb seconds to read
    "set auto-load off",
    "set sysroot /nonexistent-gpudoctor",  # no library symbols at all: addresses come from us
    "set pagination off",
    "set confirm off",
    "set unwindonsignal on",  # a signal inside a called function unwinds it instead of leaving it half-run
)

# The bootstrap proper. It runs with the real builtins (see _robust), never __main__'s names.
# It may land inside an import (torch still loading, a lazy import): importing there runs importlib
# inside itself on the thread that is importing, which CPython 3.11 cannot take (stopped within
# ``_ModuleLock.acquire``, the nested import deletes the caller's ``_blocking_on`` entry and the
# training's own import dies with a KeyError: seen in CI, and tests/scripts/bootstrap_in_acquire.py).
# So it first looks at the stack with only the modules every interpreter has loaded (``sys``,
# ``_thread``, ``posix``), and mid-import imports nothing: a helper thread waits for the import to
# end and queues the bootstrap again. (``_importing`` is payload's own, written again here: the
# bootstrap cannot import it before it knows it may import.)
_BODY = '''\
def _importing(frame):
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _session_on(control):
    import sys
    posix = sys.modules.get("os") or sys.modules["posix"]
    try:
        posix.stat(control)
    except OSError:
        return False  # the doctor's folder is gone: the session ended
    try:
        posix.stat(control + "/detach")
    except OSError:
        return True
    return False


def _after_imports(main, args):
    """On a helper thread: wait until the main thread is out of its imports, then queue the
    bootstrap on it (``Py_AddPendingCall``, the door the debugger used) and keep the callback
    alive until it ran."""
    import sys
    _thread = sys.modules["_thread"]
    nap = _thread.allocate_lock()
    nap.acquire()
    while True:
        if not _session_on(args[0]):
            return
        nap.acquire(timeout=0.05)
        if not _importing(sys._current_frames().get(main)):
            break
    import ctypes  # on this thread, never inside the main thread's import; loaded already with torch
    done = _thread.allocate_lock()
    done.acquire()

    def run(_):
        try:
            _gpudoctor_attach(*args)
        except BaseException:
            pass
        finally:
            done.release()
        return 0

    thunk = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(run)
    if ctypes.pythonapi.Py_AddPendingCall(thunk, None) != 0:
        _failed(args[0], RuntimeError("Py_AddPendingCall refused the call (queue full)"))
        return
    done.acquire()
    nap.acquire(timeout=1.0)  # the callback has returned into CPython before its thunk goes


def _failed(control, exc):
    import json, os, time
    status = os.path.join(control, "%d.installed.json" % os.getpid())
    fd = os.open(status + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({{"ok": False, "pid": os.getpid(), "t": time.time(),
                   "error": "%s: %s" % (type(exc).__name__, exc)}}, fh)
    os.replace(status + ".tmp", status)


def _gpudoctor_attach(control, pkg_parent, run_dir, doctor_pid):
    import sys  # loaded in every interpreter: this import statement takes no import lock
    if _importing(sys._getframe(1)):
        _thread = sys.modules["_thread"]
        _thread.start_new_thread(_after_imports, (_thread.get_ident(), (control, pkg_parent, run_dir, doctor_pid)))
        return
    try:
        added = None
        try:
            import gpudoctor.attach.payload as payload
        except ImportError:
            sys.path.append(pkg_parent)  # appended: the patient's own packages keep precedence
            added = pkg_parent
            import gpudoctor.attach.payload as payload
        payload.attach(run_dir, control, doctor_pid, added)
    except BaseException as exc:
        _failed(control, exc)
_gpudoctor_attach({control!r}, {pkg_parent!r}, {run_dir!r}, {doctor_pid!r})
'''

# What gdb's page runs: read the bootstrap file; a failure to read or compile it is reported too.
_LOADER = (
    "def _l(p, c):\n"
    " import os\n"
    " try:\n"
    "  with open(p, 'rb') as f: s = f.read()\n"
    "  exec(compile(s, p, 'exec'), {{'__name__': '__gpudoctor_attach__'}})\n"
    " except BaseException as e:\n"
    "  import json, time\n"
    "  t = os.path.join(c, '%d.installed.json' % os.getpid())\n"
    "  with os.fdopen(os.open(t + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:\n"
    "   json.dump({{'ok': False, 'pid': os.getpid(), 't': time.time(),"
    " 'error': 'bootstrap %s: %s' % (type(e).__name__, e)}}, f)\n"
    "  os.replace(t + '.tmp', t)\n"
    "_l({path!r}, {control!r})\n"
)

# The real ``builtins`` module, reached through attributes of a literal only: no name is looked
# up, so nothing the patient binds in __main__ (``compile = False``, ``__builtins__ = {{}}``) counts.
_BUILTINS = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'BuiltinImporter'"
             " and c.__module__ == '_frozen_importlib'][0].find_spec.__func__.__globals__['sys']"
             ".modules['builtins']")


def _robust(source: str) -> str:
    """Code that runs ``source`` with the real builtins in a fresh namespace, whatever __main__ holds.

    PyRun_SimpleString runs in __main__'s namespace (and ``sys.remote_exec`` might): a bare
    ``except`` (no name to look up) keeps a failure from raising into the patient, and nothing
    is bound in __main__.
    """
    return ("try:\n"
            f" (lambda b: b.exec({source!r}, {{'__builtins__': b, '__name__': '__gpudoctor_attach__'}}))"
            f"({_BUILTINS})\n"
            "except:\n"
            " pass\n")


class InjectError(Exception):
    """Injection impossible or failed; the message is one line for the user."""


class InjectTimeout(InjectError):
    """gdb, or the interpreter calling ``sys.remote_exec``, ran out of its budget before anything was
    queued in the patient: another try, with a budget measured afresh, is safe."""


@dataclass
class Injection:
    pid: int
    method: str  # "gdb" | "remote_exec"
    gdb_s: float  # gdb's whole run (the process is stopped only for part of it); 0 for remote_exec


def write_bootstrap(control_dir: Path, run_dir: Path, owner: tuple[int, int] | None = None) -> Path:
    """``<control>/bootstrap.py`` in a fresh private folder; ``owner`` (uid, gid): the patient's, who reads it."""
    safefs.private_dir(control_dir, "the attach folder")
    for old in control_dir.iterdir():  # a reused --out: an old detach flag would end this session at once
        if not old.is_dir():
            old.unlink()
    path = control_dir / "bootstrap.py"
    body = _BODY.format(control=str(control_dir.resolve()), pkg_parent=PKG_PARENT,
                        run_dir=str(run_dir.resolve()), doctor_pid=os.getpid())
    fd = safefs.create_new(path, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        if owner is not None:
            os.fchown(fh.fileno(), *owner)
        fh.write(_robust(body))
    return path


def request_detach(control_dir: Path) -> None:
    """Create ``<control>/detach`` by rename: a link planted under that name is replaced, never followed."""
    safefs.replace_file(control_dir / "detach", str(time.time()), 0o600)


def inject(pid: int, bootstrap: Path, timeout_s: float = budget.INJECT_BASE_S,
           before_stop: Callable[[], None] | None = None) -> Injection:
    """Queue the bootstrap in ``pid``; raises :class:`InjectError` with the reason.

    ``timeout_s`` bounds either door (gdb, or the interpreter calling ``sys.remote_exec``): the
    session scales it to the machine's load (:mod:`.budget`) and tries again on
    :class:`InjectTimeout`.

    ``before_stop`` runs right before a debugger would stop the process (not for ``remote_exec``,
    which stops nothing); it may wait, or raise :class:`InjectError` to call the injection off.
    """
    try:
        image = symbols.python_image(pid)
    except PermissionError as exc:
        raise InjectError(permission_hint(pid, str(exc))) from None
    except (OSError, symbols.SymbolError) as exc:
        raise InjectError(f"cannot read pid {pid}'s memory map: {exc}") from None
    if image is None:
        raise InjectError(f"pid {pid} is not a CPython process (no Python C API in its memory map)")
    try:
        version = symbols.python_version(pid, image)
    except (OSError, symbols.SymbolError) as exc:
        raise InjectError(f"cannot read pid {pid}'s Python version: {exc}") from None
    first: InjectError | None = None
    if version is not None and version >= (3, 14):
        try:
            return _remote_exec(pid, bootstrap, timeout_s)
        except _NotPermitted as exc:
            if not exc.as_other_user:
                raise
            first = exc  # dropped to the patient's user, ptrace was refused (Yama): gdb, as the doctor, may do
        except InjectTimeout:
            raise  # the door works, the machine is slow: the session tries it again with more time
        except InjectError as exc:
            first = exc  # e.g. Python embedded in another executable, or remote debugging disabled: try gdb
    try:
        return _gdb(pid, image, bootstrap, timeout_s, before_stop)
    except InjectError as exc:
        if first is None:
            raise
        raise InjectError(f"sys.remote_exec: {first}; then gdb: {exc}") from None  # both reasons, first first


class _NotPermitted(InjectError):
    def __init__(self, message: str, as_other_user: bool) -> None:
        super().__init__(message)
        self.as_other_user = as_other_user


def _remote_exec(pid: int, bootstrap: Path, timeout_s: float) -> Injection:
    """``sys.remote_exec``, never with the patient's code under the doctor's privileges.

    The doctor's own interpreter does it when it is 3.14+. Else the patient's interpreter
    must: it runs as the patient's user and group (no other groups; the doctor may be root,
    and a uv/conda/pyenv Python is its user's to change) with ``-I -S`` (no ``site``, so no
    ``.pth`` file runs) and a bare environment.
    """
    # the patient opens the script by its path: the real one, never the doctor's /proc/self/fd/N alias
    # of its run folder (RunFolder.at), which in the patient names one of ITS descriptors
    bootstrap = bootstrap.resolve()
    if hasattr(sys, "remote_exec"):
        try:
            sys.remote_exec(pid, str(bootstrap))  # type: ignore[attr-defined, unused-ignore]  # Python 3.14+
            return Injection(pid, "remote_exec", 0.0)
        except Exception:  # another minor version, or refused: the patient's own interpreter may do
            pass
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        status = psutil.Process(pid)
        uid, gid = status.uids().effective, status.gids().effective
    except (OSError, psutil.Error) as exc:
        raise InjectError(f"sys.remote_exec into pid {pid} failed: {exc}") from None
    drop = (uid, gid) != (os.geteuid(), os.getegid())
    user: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": []} if drop else {}
    code = f"import sys; sys.remote_exec({pid}, {str(bootstrap)!r})"
    try:
        out = subprocess.run([exe, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=timeout_s,
                             env={"PATH": childpy.SYSTEM_PATH}, cwd="/", **user)
    except subprocess.TimeoutExpired:
        # A retry is harmless even if the call went through: the payload installs once per session.
        raise InjectTimeout(f"the interpreter calling sys.remote_exec into pid {pid} took over "
                            f"{timeout_s:.0f} s") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise InjectError(f"sys.remote_exec into pid {pid} failed: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        if "ermission" in last or "not permitted" in last:
            raise _NotPermitted(permission_hint(pid, last), drop)
        raise InjectError(f"sys.remote_exec into pid {pid} failed: {last}")
    return Injection(pid, "remote_exec", 0.0)


def gdb_script(mmap_addr: int, pending_addr: int, run_addr: int, source: bytes) -> str:
    """gdb commands that copy ``source`` into a fresh page and queue it as a pending call."""
    data = source + b"\0" * (8 - len(source) % 8)
    if len(data) > _MAX_SOURCE:
        raise InjectError("bootstrap path too long")
    size = -(-len(data) // _PAGE) * _PAGE
    lines = [
        f"set $gd_page = ((void*(*)(void*, unsigned long, int, int, int, long)){mmap_addr:#x})"
        f"(0, {size}, {_PROT_RW}, {_MAP_PRIVATE_ANON}, -1, 0)",
        'printf "GPUDOCTOR page %lu\\n", (unsigned long)$gd_page',
    ]
    for off in range(0, len(data), 8):
        word = int.from_bytes(data[off:off + 8], "little", signed=True)
        lines.append(f"set *(long*)((char*)$gd_page + {off}) = {word}")
    lines += [
        f"set $gd_rc = ((int(*)(void*, void*)){pending_addr:#x})((void*){run_addr:#x}, $gd_page)",
        'printf "GPUDOCTOR pending %d\\n", $gd_rc',
    ]
    return "\n".join(lines) + "\n"


def gdb_commands(pid: int, script: Path, machine: str | None = None) -> list[str]:
    """gdb's arguments after its settings: attach, run ``script``, then put the thread back and detach.

    The last part runs even when a command of the script fails (an error ends a sourced file, not
    the commands after it). On x86-64 it restores the stopped thread's ``orig_rax`` (issue #39):
    gdb's function calls set it to -1, so that the kernel does not restart a syscall at the called
    function, and leave it so when a call fails (``Couldn't write extended state status`` in some
    containers); a thread stopped inside an interrupted ``clock_nanosleep``, ``poll`` or ``select``
    then got the kernel's internal ``-ERESTARTNOHAND`` as its result instead of the syscall going on,
    and the training died in ``time.sleep`` or a DataLoader's ``poll`` with ``OSError: [Errno 514]``.
    """
    x86_64 = (machine or platform.machine()) in ("x86_64", "AMD64")
    return ["-p", str(pid), *(["-ex", "set $gd_orig_rax = $orig_rax"] if x86_64 else []), "-x", str(script),
            *(["-ex", "set $orig_rax = $gd_orig_rax"] if x86_64 else []), "-ex", "detach", "-ex", "quit"]


def _gdb(pid: int, image: symbols.ElfImage, bootstrap: Path, timeout_s: float,
         before_stop: Callable[[], None] | None = None) -> Injection:
    gdb = childpy.which("gdb")
    if gdb is None:
        raise InjectError("gdb is not installed (apt-get install gdb), so the in-process hooks cannot be loaded")
    refused = gdbcheck.cannot_call(gdb)  # asked on a process of our own: no patient is stopped for nothing
    if refused is not None:
        raise InjectError(refused)
    try:
        pending = image.address("Py_AddPendingCall")
        run = image.address("PyRun_SimpleString")
        mmap = symbols.libc_image(pid).address("mmap")
    except PermissionError as exc:
        raise InjectError(permission_hint(pid, str(exc))) from None
    except (OSError, symbols.SymbolError) as exc:
        raise InjectError(f"cannot resolve the Python C API in pid {pid}: {exc}") from None
    if pending is None or run is None or mmap is None:
        raise InjectError(f"pid {pid}'s Python lacks Py_AddPendingCall/PyRun_SimpleString")
    launch = _robust(_LOADER.format(path=str(bootstrap.resolve()), control=str(bootstrap.parent.resolve())))
    script = _private_script(pid, gdb_script(mmap, pending, run, launch.encode()))
    argv = [gdb, "-nx", "-batch", "-q"]
    for setting in _GDB_SETTINGS:
        argv += ["-iex", setting]
    argv += gdb_commands(pid, script)
    try:
        if before_stop is not None:
            before_stop()
        t0 = time.monotonic()
        out = _run_gdb(argv, timeout_s)
        gdb_s = time.monotonic() - t0
    finally:
        script.unlink(missing_ok=True)
    if "GPUDOCTOR pending 0" in out:
        return Injection(pid, "gdb", gdb_s)
    if "ptrace: Operation not permitted" in out:
        raise InjectError(permission_hint(pid, "ptrace: Operation not permitted"))
    if "No such process" in out:
        raise InjectError(f"pid {pid} exited before gdb could attach")
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and "GPUDOCTOR" not in ln]
    # a failed command ends the script with "<file>:N: Error in sourced command file:" and gdb's reason
    failed = next((i for i, ln in enumerate(lines) if "Error in sourced command file" in ln), None)
    last = lines[failed + 1] if failed is not None and failed + 1 < len(lines) else (lines or ["no output"])[-1]
    raise InjectError(f"gdb could not load the hooks into pid {pid}: {last}")


def _private_script(pid: int, text: str) -> Path:
    """gdb's commands, in the doctor's own 0700 scratch folder: never where the patient's user writes.

    gdb runs them with the doctor's privileges (root, maybe), so the run folder's ``attach/``, which
    the patient's user owns, is no place for them. Created O_EXCL|O_NOFOLLOW under a fresh name.
    """
    try:
        path = scratch.session_dir() / f"gdb-{pid}-{secrets.token_hex(4)}.txt"
        fd = safefs.create_new(path, 0o600)
    except (OSError, UserError) as exc:
        raise InjectError(f"cannot write gdb's commands for pid {pid}: {exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _run_gdb(argv: list[str], timeout_s: float) -> str:
    """Run gdb in its own session (a Ctrl-C at the doctor must not reach it mid-call).

    Out of time before it queued the call: :class:`InjectTimeout`. Out of time after (its output
    says so), the call is in: the output is returned as if gdb had finished.
    """
    # gdb holds the patient stopped: it must never wait behind the doctor's idle priority.
    # The system PATH: gdb runs ``iconv -l`` by name as it starts (childpy.doctor_env).
    proc = priority.popen_normal(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True, env=childpy.doctor_env())
    try:
        out: str = proc.communicate(timeout=timeout_s)[0]  # text=True: a str
        return out
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: gdb then detaches (removing its breakpoints) before it exits.
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if "GPUDOCTOR pending 0" in (out or ""):
            return str(out)
        raise InjectTimeout(f"gdb timed out after {timeout_s:.0f} s attaching to the process; "
                            f"last output: {(out or '').strip()[-200:]}") from None


def read_status(control_dir: Path, pid: int, kind: str, owner: int | None = None) -> dict[str, object] | None:
    """``<control>/<pid>.<kind>.json`` as the patient wrote it; None while absent or unreadable.

    The folder is the patient user's: the file is read O_NOFOLLOW|O_NONBLOCK, must be a regular
    file of ``owner`` (or the doctor's), at most 64 KiB. A link or FIFO planted there is an error
    status (``ok`` false), never followed nor waited on.
    """
    path = control_dir / f"{pid}.{kind}.json"
    try:
        data = json.loads(safefs.read_bytes(path, owner=owner, limit=_STATUS_LIMIT))
    except safefs.UnsafeFile as exc:
        return {"ok": False, "error": f"refused the status file: {exc}"}
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def permission_hint(pid: int, detail: str) -> str:
    scope = _ptrace_scope()
    hint = (
        f"not permitted to inspect pid {pid} ({detail}); run gpudoctor as the same user as the training "
        "process (or with sudo / CAP_SYS_PTRACE)"
    )
    if scope is not None and scope > 0:
        hint += (f", or allow ptrace of non-children: /proc/sys/kernel/yama/ptrace_scope is {scope}, "
                 "'echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope' sets it to 0")
    if os.path.exists("/.dockerenv"):
        hint += "; in Docker, start the container with --cap-add=SYS_PTRACE"
    return hint


def _ptrace_scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None
