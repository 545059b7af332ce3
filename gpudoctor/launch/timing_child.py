"""Run a timing child after the training exited: the doctor's own measurement, not a training.

``length_cost`` and ``warm_compute`` each time a stand-in in an isolated child at normal priority
(the measurement is the point), with the hooks off and no run folder in its environment, from the
root folder (nothing of the user's working directory on its path); the child prints one JSON line.

The child's heap is set to behave as a training process's does after many steps, not as a fresh
one's (:data:`WARM_HEAP`). glibc gives a freed tensor's pages back to the kernel when they sit at
the top of the heap (over 128 KiB by default), so a fresh process that only times passes maps its
tensors afresh each pass, a page fault per 4 KiB; in a training process the heap's top is held by
its other allocations (a batch, the optimizer's state) and the next pass reuses the pages. On this
2-core VM a narrow GPT-2's passes at a padding fix's widths took ~9,000-14,000 page faults and
42-55 ms each in a fresh process, 230-1,400 faults and 31-33 ms with the heap kept, and 30.5-34.6 ms
in the training loop itself (the loop's before/after ratio 0.11-0.12, the fresh child's 0.13-0.17);
a small CNN's step 20-25 ms fresh, 14-20 ms kept, 14.5-17 ms in its loop. A setting of the
environment's own (``MALLOC_*`` or ``GLIBC_TUNABLES``, the training's too) is left as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from gpudoctor.processes import childpy, priority


class Failed(Exception):
    """The child did not answer: ``str()`` says why (no JSON, an OS error); ``timed_out`` when stopped."""

    def __init__(self, why: str, timed_out: bool = False) -> None:
        super().__init__(why)
        self.timed_out = timed_out


# glibc's largest dynamic mmap threshold (what a process that freed a large tensor reaches), and a
# trim threshold no pass's tensors reach: freed pages stay with the child, as a training's do
WARM_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the doctor's (``base``), no run folder, the hooks off, a kept heap."""
    env = childpy.doctor_env(base)
    env.pop("GPUDOCTOR_RUN_DIR", None)
    env["GPUDOCTOR_HOOKS"] = "0"  # the doctor's own timing is not a training to record
    if "glibc.malloc" not in env.get("GLIBC_TUNABLES", ""):
        for name, value in WARM_HEAP.items():
            env.setdefault(name, value)
    return env


def run(module: str, job: Mapping[str, Any], budget_s: float) -> Any:
    """The child's last stdout line, parsed; stopped at twice ``budget_s`` and 30 s (raises :class:`Failed`)."""
    try:
        proc = priority.popen_normal(childpy.isolated(module, json.dumps(job)), env=child_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=os.sep)
    except OSError as exc:
        raise Failed(type(exc).__name__) from exc
    try:
        out, _ = proc.communicate(timeout=2 * budget_s + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Failed("it took too long", timed_out=True) from None
    try:
        return json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise Failed(type(exc).__name__) from exc
