"""Can gdb call a function inside a process on this machine? Asked before any patient is stopped.

Loading the hooks with gdb means stopping the patient and calling ``mmap`` and
``Py_AddPendingCall`` in it. On some machines every such call fails: a Firecracker guest with
kernel 6.18 and gdb 13 answers "Couldn't write extended state status: Bad address" (gdb cannot
write the thread's XSAVE area back), and a stop that cannot call anything gains nothing and risks
the patient (a system call it was in may not restart cleanly). So the doctor first asks gdb to make
the same kind of call in a sleeping Python process of its own, once per session (about 0.5 s), before
the first patient is stopped; where that fails,
no patient is stopped at all, and the session says why and keeps to stack samples.

An answer that says nothing about calls (gdb may not attach to a sibling under Yama's ptrace
scope, say) is no verdict: the patient's own attach then tells.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

from gpudoctor.attach import symbols
from gpudoctor.processes import childpy

PROBE_TIMEOUT_S = 20.0
_CALL_FAILED = ("Couldn't write", "Couldn't read", "Cannot access memory", "The program being debugged was signaled")


@functools.cache
def cannot_call(gdb: str) -> str | None:
    """Why gdb cannot call into a process here (one line), or None when it can or cannot tell."""
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import time\nwhile True: time.sleep(0.05)"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=childpy.doctor_env())
    try:
        time.sleep(0.3)
        try:
            mmap = symbols.libc_image(proc.pid).address("mmap")
        except (OSError, symbols.SymbolError):
            return None
        if mmap is None:
            return None
        call = f"call ((void*(*)(void*, unsigned long, int, int, int, long)){mmap:#x})(0, 4096, 3, 34, -1, 0)"
        argv = [gdb, "-nx", "-batch", "-q", "-iex", "set auto-solib-add off", "-iex", "set auto-load off",
                "-iex", "set confirm off", "-iex", "set unwindonsignal on", "-p", str(proc.pid), "-ex", call]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
                                  env=childpy.doctor_env(), start_new_session=True)
        except (OSError, subprocess.SubprocessError):
            return None
        text = done.stdout + done.stderr
        if "$1 = (void *) 0x" in text:
            return None
        failed = next((ln.strip() for ln in text.splitlines() if any(m in ln for m in _CALL_FAILED)), None)
        if failed is None:
            return None  # no verdict on calls (not attached, say): the patient's own attach will tell
        return (f"gdb cannot call into a process on this machine ({failed.rstrip('.')}; tried on a process of the "
                "doctor's own), so no process was stopped")
    finally:
        proc.kill()
        proc.wait()
