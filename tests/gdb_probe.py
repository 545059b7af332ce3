"""Can gdb call a function inside a process on this machine? The attach tests need it.

``gpudoctor attach`` (Python before 3.14) loads its hooks by having gdb stop the patient and call
``mmap`` and ``Py_AddPendingCall`` in it. Some machines refuse the call itself: on a Firecracker
guest with kernel 6.18 and gdb 13, every call fails with "Couldn't write extended state status:
Bad address" (gdb cannot write the thread's XSAVE area back). There the product says so and
keeps to stack samples (tests/test_attach_units.py checks that wording and that the patient lives);
the tests that need hooks loaded by gdb are skipped with gdb's own reason. Probed once per
session, on a sleeping Python process of the test's own, never on a patient.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import time


@functools.cache
def gdb_cannot_inject() -> str | None:
    """None where gdb can call into a Python process here; else one line saying why not."""
    gdb = shutil.which("gdb")
    if gdb is None or sys.platform != "linux":
        return "attach injects with gdb on Linux (gdb not installed)"
    from gpudoctor.attach import symbols

    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        mmap = symbols.libc_image(proc.pid).address("mmap")
        if mmap is None:
            return "libc's mmap not found in a Python process"
        call = f"call ((void*(*)(void*, unsigned long, int, int, int, long)){mmap:#x})(0, 4096, 3, 34, -1, 0)"
        out = subprocess.run([gdb, "-nx", "-batch", "-q", "-iex", "set auto-solib-add off", "-iex", "set confirm off",
                              "-iex", "set unwindonsignal on", "-p", str(proc.pid), "-ex", call],
                             capture_output=True, text=True, timeout=60, check=False)
        text = out.stdout + out.stderr
        if "$1 = (void *) 0x" in text:
            return None
        reason = next((ln.strip() for ln in text.splitlines() if "rror" in ln or "Couldn't" in ln), text.strip()[-200:])
        return f"gdb cannot call into a process on this machine: {reason}"
    except (OSError, subprocess.SubprocessError, symbols.SymbolError) as exc:
        return f"gdb probe failed: {exc}"
    finally:
        proc.kill()
        proc.wait()
