"""Shared by the transparency scripts: each case in a forked child of one interpreter.

The doctor's state is per process (which model trained first, whether a step was seen), so each case
runs in a child forked from an interpreter that imported everything but trained nothing: a fresh
process to the doctor, at the price of one start-up for all cases. A case's result (or its error) is
one JSON line in OUT, in the order of the cases.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable


def run_forked(cases: dict[str, Callable[[], str]], names: list[str], out: str) -> None:
    with open(out, "w") as f:
        for name in names or list(cases):
            part = f"{out}.{name}"
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    result = {"case": name, "sha256": cases[name]()}
                except Exception as exc:  # a case that fails is a result too: bare and doctored must agree
                    result, code = {"case": name, "error": f"{type(exc).__name__}: {exc}"}, 1
                with open(part, "w") as p:
                    p.write(json.dumps(result))
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            try:
                with open(part) as p:
                    line = p.read()
                os.remove(part)
            except OSError:
                line = json.dumps({"case": name, "error": f"child ended with status {status} and no result"})
            f.write(line + "\n")
            f.flush()
