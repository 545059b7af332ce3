"""Stack samples (``samples/stacks.jsonl``) as stand-in events for processes without hooks.

``gpudoctor attach`` samples stacks from outside with py-spy, always; when the
in-process hooks could not be loaded (no debugger, not permitted), those
samples are all there is. Each run of consecutive samples in one category
becomes a span of that many sample periods, the first sample inside the loop
becomes ``first_step``, tokenizer samples become a ``tokenize`` counter, so the
same breakdown and rules apply, with the resolution of the sampling period.
A ``loop`` span from the first to the last in-loop sample marks where the
training loop was seen, since there are no step events to mark its end.
No ``step`` or ``batch`` events are made up: step counts and padding stay
unknown. Processes that have hook events are never replaced.

Row (one per process per sampling window)::

    {"t": epoch_s,          # time of the window's first sample slot
     "t1": epoch_s,         # end of the window
     "pid": int, "ppid": int | null, "rank": int | null,
     "role": "main" | "worker",
     "rate_hz": float,      # samples per second; sample i stands for t + i / rate_hz
     "codes": str}          # one Code letter per sample of the process's main thread
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from gpudoctor.core.events import SpanEvent
from gpudoctor.recording.clock import ClockSteps
from gpudoctor.recording.read import read_samples
from gpudoctor.recording.records import Records
from gpudoctor.recording.validate import is_time


class Code:
    """One letter per sample: what the process's main thread was doing."""

    DATA_WAIT = "D"
    DATA_WAIT_TOKENIZE = "T"  # tokenizing while the loop waits for its batch
    TOKENIZE = "t"  # tokenizing outside a DataLoader wait
    CHECKPOINT = "K"
    EVAL = "E"
    FORMAT = "F"
    MODEL_LOAD = "M"
    COMPUTE = "C"  # forward, backward, optimizer
    OTHER = "O"
    WORKER_FETCH = "W"  # a DataLoader worker building a batch
    WORKER_IDLE = "w"


LOOP = {Code.DATA_WAIT, Code.DATA_WAIT_TOKENIZE, Code.COMPUTE}
# A training loop is seen in several samples: a launcher (torchrun's agent) caught once inside
# torch's own code is not one (1 sample of 190 made it a second "rank 0" under load)
MIN_LOOP_SAMPLES = 3
MIN_LOOP_SHARE = 0.05
SPAN_OF = {Code.DATA_WAIT: "data_wait", Code.DATA_WAIT_TOKENIZE: "data_wait", Code.CHECKPOINT: "checkpoint",
           Code.EVAL: "eval", Code.FORMAT: "format", Code.MODEL_LOAD: "model_load"}
TOKENIZING = {Code.DATA_WAIT_TOKENIZE, Code.TOKENIZE}


def load_stack_rows(root: Path, clock: ClockSteps | None = None) -> list[dict[str, Any]]:
    """``samples/stacks.jsonl``'s valid rows; ``clock``: the recording's wall-clock steps, taken out."""
    rows, _ = read_samples(Path(root) / "samples" / "stacks.jsonl", _clean_row)
    if clock:
        clock.fix_rows(rows, ("t", "t1"))
    return rows


def _clean_row(row: Any) -> dict[str, Any] | None:
    if type(row) is not dict or not is_time(row.get("t")) or type(row.get("pid")) is not int:
        return None
    rate = row.get("rate_hz")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= 10_000 \
            or type(row.get("codes")) is not str:
        return None
    return row


def sampled_records(rows: list[dict[str, Any]], skip_pids: set[int]) -> dict[int, Records]:
    """The stand-in events of :func:`sampled_events`, typed as the reader types a process's lines."""
    out = {}
    for pid, events in sampled_events(rows, skip_pids).items():
        records = Records()
        for e in events:
            records.add(e)
        out[pid] = records.finish()
    return out


def sampled_spans(rows: list[dict[str, Any]], skip_pids: set[int]) -> dict[int, list[SpanEvent]]:
    """The stand-in spans of :func:`sampled_events`, with their names (for the tables)."""
    return {pid: [cast(SpanEvent, e) for e in events if e["k"] == "span"]
            for pid, events in sampled_events(rows, skip_pids).items()}


def sampled_events(rows: list[dict[str, Any]], skip_pids: set[int]) -> dict[int, list[dict[str, Any]]]:
    """Stand-in event lines for each sampled main process not in ``skip_pids``, as the hooks would write them."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("role") == "main" and row["pid"] not in skip_pids:
            by_pid.setdefault(row["pid"], []).append(row)
    out = {}
    for pid, mine in by_pid.items():
        mine.sort(key=lambda r: r["t"])
        events = _events(pid, mine)
        if events:
            out[pid] = events
    return out


def _samples(rows: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(time, period, code) of every sample, in time order."""
    out = []
    for row in rows:
        period = 1.0 / float(row["rate_hz"])
        t0 = float(row["t"])
        out += [(t0 + i * period, period, code) for i, code in enumerate(row["codes"])]
    return out


def _events(pid: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    samples = _samples(rows)
    first = rows[0]
    events: list[dict[str, Any]] = [{
        "k": "proc", "t": first["t"], "pid": pid, "ppid": first.get("ppid"), "rank": first.get("rank"),
        "local_rank": None, "world_size": None, "argv": first.get("argv") or [], "create_time": None,
        "is_worker": False, "libs": {}, "sampled": True,
    }]
    in_loop = [(t, p) for t, p, code in samples if code in LOOP]
    blip = len(in_loop) < max(MIN_LOOP_SAMPLES, MIN_LOOP_SHARE * len(samples))
    if blip:
        in_loop = []  # not a loop: nor are its "waits for a batch"
    first_loop = in_loop[0][0] if in_loop else None
    if first_loop is not None:
        events.append({"k": "first_step", "t": first_loop})
        # Where the loop was last seen: compute after the last DataLoader wait is still the loop.
        end = in_loop[-1][0] + in_loop[-1][1]
        events.append({"k": "span", "c": "loop", "t0": first_loop, "dt": end - first_loop, "name": "stack samples"})
    events += [sp for sp in _spans(samples) if not (blip and sp["c"] == "data_wait")]
    events += _tokenize_counters(samples, first_loop)
    return events


def _spans(samples: list[tuple[float, float, str]]) -> list[dict[str, Any]]:
    """Consecutive samples of one span category, as one span each (a gap ends a run)."""
    spans: list[dict[str, Any]] = []
    run: list[Any] | None = None  # [category, t0, t_end]
    for t, period, code in samples:
        cat = SPAN_OF.get(code)
        if run is not None and (cat != run[0] or t - run[2] > 0.5 * period):
            spans.append({"k": "span", "c": run[0], "t0": run[1], "dt": run[2] - run[1], "name": "stack samples"})
            run = None
        if cat is None:
            continue
        if run is None:
            run = [cat, t, t + period]
        else:
            run[2] = t + period
    if run is not None:
        spans.append({"k": "span", "c": run[0], "t0": run[1], "dt": run[2] - run[1], "name": "stack samples"})
    return spans


def _tokenize_counters(samples: list[tuple[float, float, str]], first_loop: float | None) -> list[dict[str, Any]]:
    """Tokenizer samples before and after the first step, as two counter lines."""
    before = [(t, p) for t, p, code in samples if code in TOKENIZING and (first_loop is None or t < first_loop)]
    after = [(t, p) for t, p, code in samples if code in TOKENIZING and first_loop is not None and t >= first_loop]
    out = []
    for part in (before, after):
        if part:  # stamped at the end of its last sample: after the first step means t > first_step
            out.append({"k": "counter", "t": part[-1][0] + part[-1][1], "name": "tokenize",
                        "calls": len(part), "s": sum(p for _, p in part)})
    return out
