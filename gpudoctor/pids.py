"""Is a process alive: one answer for attach's locks and sessions and replay's scratch folders.

Stdlib only: the attach payload imports it inside the patient.
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Running (a zombie is not); a process of another user counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
