"""Run a timing child after the training exited: the doctor's own measurement, not a training.

``length_cost`` and ``warm_compute`` each time a stand-in in an isolated child at normal priority
(the measurement is the point), with the hooks off and no run folder in its environment, from the
root folder (nothing of the user's working directory on its path); the child prints one JSON line.
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


def run(module: str, job: Mapping[str, Any], budget_s: float) -> Any:
    """The child's last stdout line, parsed; stopped at twice ``budget_s`` and 30 s (raises :class:`Failed`)."""
    env = childpy.doctor_env()
    env.pop("GPUDOCTOR_RUN_DIR", None)
    env["GPUDOCTOR_HOOKS"] = "0"  # the doctor's own timing is not a training to record
    try:
        proc = priority.popen_normal(childpy.isolated(module, json.dumps(job)), env=env, stdout=subprocess.PIPE,
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
