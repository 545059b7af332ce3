"""Put :mod:`gpudoctor.attach.payload` into a live CPython process.

Python 3.14+ has ``sys.remote_exec``: the patient's own interpreter runs it
for us. Older versions get the debugger route ``memray attach`` and pyrasite
use, made gentler:

* the addresses of ``mmap``, ``Py_AddPendingCall`` and ``PyRun_SimpleString``
  are resolved here (:mod:`.symbols`), so gdb attaches with no symbols and the
  patient is stopped for ~30 ms, not the ~0.5 s symbol loading takes;
* gdb only maps one page, writes the bootstrap source into it and queues
  ``PyRun_SimpleString(page)`` with ``Py_AddPendingCall``. CPython runs it on
  the main thread at the next bytecode boundary, with the GIL, like a signal
  handler: never in the middle of an allocation or a half-built object, which
  is where calling ``PyRun_SimpleString`` from a stopped thread can land;
* the bootstrap swallows every exception (a pending call that fails would raise
  ``SystemError`` in the patient) and reports through a status file instead.

Detach needs no debugger: the payload's watchdog removes the hooks when the
doctor creates ``<control>/detach`` or exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gpudoctor
from gpudoctor.attach import symbols

PKG_PARENT = str(Path(gpudoctor.__file__).resolve().parent.parent)
GDB_TIMEOUT_S = 20.0
_PAGE = 4096
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

_BOOTSTRAP = '''\
def _gpudoctor_attach():
    import json, os, sys, time
    control = {control!r}
    status = os.path.join(control, "%d.installed.json" % os.getpid())
    try:
        added = None
        try:
            import gpudoctor.attach.payload as payload
        except ImportError:
            sys.path.append({pkg_parent!r})  # appended: the patient's own packages keep precedence
            added = {pkg_parent!r}
            import gpudoctor.attach.payload as payload
        payload.attach({run_dir!r}, control, {doctor_pid!r}, added)
    except BaseException as exc:
        with open(status + ".tmp", "w") as fh:
            json.dump({{"ok": False, "pid": os.getpid(), "t": time.time(),
                       "error": "%s: %s" % (type(exc).__name__, exc)}}, fh)
        os.replace(status + ".tmp", status)
_gpudoctor_attach()
'''

# What PyRun_SimpleString runs: in __main__'s namespace, so it binds no name there.
_LAUNCH = (
    "try:\n"
    " exec(compile(open({path!r}).read(), {path!r}, 'exec'), {{'__name__': '__gpudoctor_attach__'}})\n"
    "except BaseException:\n"
    " pass\n"
)


class InjectError(Exception):
    """Injection impossible or failed; the message is one line for the user."""


@dataclass
class Injection:
    pid: int
    method: str  # "gdb" | "remote_exec"
    gdb_s: float  # gdb's whole run (the process is stopped only for part of it); 0 for remote_exec


def write_bootstrap(control_dir: Path, run_dir: Path) -> Path:
    control_dir.mkdir(parents=True, exist_ok=True)
    path = control_dir / "bootstrap.py"
    path.write_text(_BOOTSTRAP.format(control=str(control_dir.resolve()), pkg_parent=PKG_PARENT,
                                      run_dir=str(run_dir.resolve()), doctor_pid=os.getpid()))
    return path


def request_detach(control_dir: Path) -> None:
    (control_dir / "detach").write_text(str(time.time()))


def inject(pid: int, bootstrap: Path, timeout_s: float = GDB_TIMEOUT_S,
           before_stop: Callable[[], None] | None = None) -> Injection:
    """Queue the bootstrap in ``pid``; raises :class:`InjectError` with the reason.

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
    if version is not None and version >= (3, 14):
        try:
            return _remote_exec(pid, bootstrap, timeout_s)
        except InjectError as exc:
            if "not permitted" in str(exc):
                raise
            # e.g. Python embedded in another executable, or remote debugging disabled: try gdb
    return _gdb(pid, image, bootstrap, timeout_s, before_stop)


def _remote_exec(pid: int, bootstrap: Path, timeout_s: float) -> Injection:
    exe = os.readlink(f"/proc/{pid}/exe")
    code = f"import sys; sys.remote_exec({pid}, {str(bootstrap)!r})"
    try:
        out = subprocess.run([exe, "-I", "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InjectError(f"sys.remote_exec into pid {pid} failed: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        if "ermission" in last or "not permitted" in last:
            raise InjectError(permission_hint(pid, last))
        raise InjectError(f"sys.remote_exec into pid {pid} failed: {last}")
    return Injection(pid, "remote_exec", 0.0)


def gdb_script(mmap_addr: int, pending_addr: int, run_addr: int, source: bytes) -> str:
    """gdb commands that copy ``source`` into a fresh page and queue it as a pending call."""
    data = source + b"\0" * (8 - len(source) % 8)
    if len(data) > _PAGE:
        raise InjectError("bootstrap path too long")
    lines = [
        f"set $gd_page = ((void*(*)(void*, unsigned long, int, int, int, long)){mmap_addr:#x})"
        f"(0, {_PAGE}, {_PROT_RW}, {_MAP_PRIVATE_ANON}, -1, 0)",
        'printf "GPUDOCTOR page %lu\\n", (unsigned long)$gd_page',
    ]
    for off in range(0, len(data), 8):
        word = int.from_bytes(data[off:off + 8], "little", signed=True)
        lines.append(f"set *(long*)((char*)$gd_page + {off}) = {word}")
    lines += [
        f"set $gd_rc = ((int(*)(void*, void*)){pending_addr:#x})((void*){run_addr:#x}, $gd_page)",
        'printf "GPUDOCTOR pending %d\\n", $gd_rc',
        "detach",
        "quit",
    ]
    return "\n".join(lines) + "\n"


def _gdb(pid: int, image: symbols.ElfImage, bootstrap: Path, timeout_s: float,
         before_stop: Callable[[], None] | None = None) -> Injection:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise InjectError("gdb is not installed (apt-get install gdb), so the in-process hooks cannot be loaded")
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
    launch = _LAUNCH.format(path=str(bootstrap.resolve())).encode()
    script = bootstrap.with_name(f"gdb-{pid}.txt")
    script.write_text(gdb_script(mmap, pending, run, launch))
    argv = [gdb, "-nx", "-batch", "-q"]
    for setting in _GDB_SETTINGS:
        argv += ["-iex", setting]
    argv += ["-p", str(pid), "-x", str(script)]
    if before_stop is not None:
        before_stop()
    t0 = time.monotonic()
    out = _run_gdb(argv, timeout_s)
    gdb_s = time.monotonic() - t0
    if "GPUDOCTOR pending 0" in out:
        return Injection(pid, "gdb", gdb_s)
    if "ptrace: Operation not permitted" in out:
        raise InjectError(permission_hint(pid, "ptrace: Operation not permitted"))
    if "No such process" in out:
        raise InjectError(f"pid {pid} exited before gdb could attach")
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip() and "GPUDOCTOR" not in ln), "no output")
    raise InjectError(f"gdb could not load the hooks into pid {pid}: {last.strip()}")


def _run_gdb(argv: list[str], timeout_s: float) -> str:
    """Run gdb in its own session (a Ctrl-C at the doctor must not reach it mid-call)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_normal_priority)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return out
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: gdb then detaches (removing its breakpoints) before it exits.
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raise InjectError(f"gdb timed out after {timeout_s:.0f} s attaching to the process; "
                          f"last output: {(out or '').strip()[-200:]}") from None


def _normal_priority() -> None:
    """gdb holds the patient stopped: it must not wait behind the doctor's own niceness."""
    with contextlib.suppress(OSError):  # lowering niceness needs CAP_SYS_NICE; else it keeps the doctor's
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def read_status(control_dir: Path, pid: int, kind: str) -> dict[str, object] | None:
    path = control_dir / f"{pid}.{kind}.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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
