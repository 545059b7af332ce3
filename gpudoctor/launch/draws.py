"""Time a stand-in in several forked processes, one after another: one process is one draw.

The same forward and backward, timed in separate processes on a quiet 2-core VM, differ between
processes by more than within one: a GPT-2 pass at 344 tokens over one at 1024 read 0.127 to 0.191
in twelve processes (three started apart, three forks each of three more), each steady within
itself. A prediction divided by one such draw missed by as much, so the timing workers keep a
median of draws (:func:`median_ratios`). A worker imports torch once and forks
each draw after it (the imports are most of a draw's cost; no torch op has run, so no thread pool
is forked); each draw builds its own model and tensors, sends back one JSON document on a pipe,
and dies with the worker (``PR_SET_PDEATHSIG``). Another draw starts while the time spent and the
longest draw so far fit in the total: a model whose one draw takes it all gets one, as before.
Stdlib only: the workers import this before torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

DRAWS = 3
MAX_BYTES = 1 << 20  # a draw's answer, at most (a few hundred bytes in practice)


def in_forks(run: Callable[[float], Any], per_draw_s: float, total_s: float,
             draws: int = DRAWS) -> tuple[list[Any], str | None]:
    """Up to ``draws`` results of ``run(per_draw_s)``, each in a forked process, while the time
    spent and the longest draw so far fit in ``total_s``; and the error that stopped them, if any.
    A draw that fails stops the rest (the next would fail the same way: a config that does not build)."""
    start, longest = time.monotonic(), 0.0
    got: list[Any] = []
    for _ in range(draws):
        if got and time.monotonic() - start + longest > total_s:
            break
        began = time.monotonic()
        answer = _one(run, per_draw_s)
        longest = max(longest, time.monotonic() - began)
        if "error" in answer:
            return got, str(answer["error"])[:200]
        got.append(answer["result"])
    return got, None


def _one(run: Callable[[float], Any], seconds: float) -> dict[str, Any]:
    """``run(seconds)`` in a forked child: ``{"result": ...}`` or ``{"error": "..."}``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the draw: nothing it does returns into the worker's own code
        code = 1
        try:
            os.close(read_end)
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the worker
            try:
                answer: dict[str, Any] = {"result": run(seconds)}
            except Exception as exc:  # out of memory, a config that does not build: said, not raised
                answer = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            data = json.dumps(answer).encode()
            while data:
                data = data[os.write(write_end, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    with os.fdopen(read_end, "rb") as pipe:
        while (chunk := pipe.read(65536)) and sum(map(len, chunks)) <= MAX_BYTES:
            chunks.append(chunk)
        if chunk:  # more than an answer: not one
            os.kill(pid, signal.SIGKILL)
            chunks = []
    _, status = os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        return {"error": f"a timed draw ended without its figures (wait status {status})"}
    return answer if isinstance(answer, dict) and ("result" in answer or "error" in answer) else {
        "error": "a timed draw answered in an unknown shape"}


def median_ratios(draws: Sequence[dict[float, float]]) -> dict[float, float]:
    """Seconds at each key (a width) across draws: each draw read relative to its own seconds at
    the largest key all of them timed, the median of those ratios, times the median of that
    reference. A process that runs everything 10% slow moves the scale, not the shape; a draw
    that bent one width alone is outvoted."""
    keys = set.intersection(*(set(d) for d in draws)) if draws else set()
    if not keys:
        return dict(draws[0]) if draws else {}
    ref = max(keys)
    scale = statistics.median(d[ref] for d in draws)
    widths = list(dict.fromkeys(k for d in draws for k in d))  # in the order timed
    return {k: scale * statistics.median(d[k] / d[ref] for d in draws if k in d and d[ref] > 0) for k in widths
            if any(k in d and d[ref] > 0 for d in draws)}
