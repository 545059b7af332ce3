"""Check every line of a recording before the analysis trusts it.

A recording comes from disk: a killed writer, a full disk, another version or
a hand-edited file can leave anything in it. Lines here are checked against the
kinds in :mod:`gpudoctor.core.events`: an event missing a field the
analysis needs, or with a value of the wrong type, NaN, a negative duration or
an absurd number, is dropped (and counted, for a note in the report) rather
than allowed to crash or skew the analysis. Extra fields are kept, so newer
writers still load; a kind no part of this version reads (:data:`KNOWN_KINDS`) is
dropped and counted by the reader, as it would only take memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from gpudoctor.core import events

Check = Callable[[Any], bool]

MAX_TIME = 1e11  # epoch seconds (year ~5100): anything beyond is corrupt
MAX_DURATION_S = 1e7  # ~4 months
MAX_COUNT = 2**53
MAX_DRAWS = 16  # processes a timing file may say it took the median of (gpudoctor.launch.draws)


def draws_of(v: Any) -> int:
    """A timing file's count of draws, or 1 where it has none or one not to trust."""
    return v if type(v) is int and 1 <= v <= MAX_DRAWS else 1


def is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and abs(v) < 1e15


def is_time(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and abs(v) < MAX_TIME


def is_duration(v: Any) -> bool:
    return type(v) in (int, float) and 0 <= v <= MAX_DURATION_S


def is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v < MAX_COUNT


def is_int(v: Any) -> bool:
    return type(v) is int and abs(v) < MAX_COUNT


def is_str(v: Any) -> bool:
    return type(v) is str


def is_bool(v: Any) -> bool:
    return type(v) is bool


def is_dict(v: Any) -> bool:
    return type(v) is dict


def is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def is_count_list(v: Any) -> bool:
    return type(v) is list and (not v or (set(map(type, v)) == {int} and min(v) >= 0 and max(v) < MAX_COUNT))


def is_libs(v: Any) -> bool:
    return type(v) is dict and all(x is None or type(x) is str for x in v.values())


def opt(check: Check) -> Check:
    """``check`` or null."""
    return lambda v: v is None or check(v)


def is_options(v: Any) -> bool:
    return type(v) is list and all(type(o) is dict and is_str(o.get("dest")) for o in v)


# What each mark of gpudoctor/core/events.py's types means on load.
_MARKS: dict[str, Check] = {
    "time": is_time,
    "duration": is_duration,
    "count": is_count,
    "int": is_int,
    "number": is_number,
    "count_list": is_count_list,
    "libs": is_libs,
    "options": is_options,
}


def _check_of(hint: Any) -> Check | None:
    """The check a field's type asks for (None: not checked)."""
    if get_origin(hint) in (Union, UnionType):
        parts = [a for a in get_args(hint) if a is not type(None)]
        inner = _check_of(parts[0]) if len(parts) == 1 else None
        return None if inner is None else opt(inner) if len(parts) < len(get_args(hint)) else inner
    if get_origin(hint) is Annotated:
        return _MARKS.get(hint.__metadata__[0])
    if hint is str:
        return is_str
    if hint is bool:
        return is_bool
    if hint is dict or get_origin(hint) is dict:
        return is_dict
    if get_origin(hint) is list and get_args(hint) == (str,):
        return is_str_list
    return None


def _fields(kind: type) -> tuple[dict[str, Check], dict[str, Check]]:
    hints = get_type_hints(kind, include_extras=True)
    checks = {name: check for name, hint in hints.items() if name != "k" and (check := _check_of(hint))}
    required = kind.__required_keys__  # type: ignore[attr-defined]  # every TypedDict has them
    return ({n: c for n, c in checks.items() if n in required}, {n: c for n, c in checks.items() if n not in required})


# Every kind this version's analysis reads (the ``k`` of each :data:`events.Event` type): a line of
# another kind (a newer writer's, or a forged one) is not understood, so the reader drops and counts it.
KNOWN_KINDS: frozenset[str] = frozenset(
    kind for cls in get_args(events.Event) for kind in get_args(get_type_hints(cls)["k"])
)

# kind -> (required fields, optional fields); a present optional field must pass too. Derived from
# the event types, so the format is declared once (gpudoctor/core/events.py).
EVENT_FIELDS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    kind: _fields(cls) for kind, cls in events.CHECKED.items()
}


def _is_time(hint: Any) -> bool:
    if get_origin(hint) in (Union, UnionType):
        return any(_is_time(a) for a in get_args(hint))
    return get_origin(hint) is Annotated and hint.__metadata__[0] == "time"


# kind -> its fields that are wall-clock times (``core.events.Time``): what a clock step moves.
TIME_FIELDS: dict[str, tuple[str, ...]] = {
    kind: tuple(n for n, h in get_type_hints(cls, include_extras=True).items() if _is_time(h))
    for kind, cls in events.CHECKED.items()
}

# TrainingArguments fields the rules compute with: a value of another type is nulled.
_TRAINER_ARG_CHECKS: dict[str, Check] = {
    "per_device_train_batch_size": is_count,
    "per_device_eval_batch_size": is_count,
    "gradient_accumulation_steps": is_count,
    "dataloader_num_workers": is_count,
    "dataloader_prefetch_factor": is_count,
    "max_steps": is_int,
    "save_steps": is_number,
    "eval_steps": is_number,
    "num_train_epochs": is_number,
}


# The commonest kinds of a long run, checked without the generic table: the same rules as
# EVENT_FIELDS for the floats and ints the hooks write, so read.py takes them on a fast path
# and hands anything else (ints for floats, odd extras) to clean_event.


def fast_step(e: dict[str, Any]) -> bool:
    t, dt, n = e.get("t"), e.get("dt", 0.0), e.get("n", 0)
    return (type(t) is float and 0 < t < MAX_TIME and type(dt) is float and 0 <= dt <= MAX_DURATION_S
            and type(n) is int and 0 <= n < MAX_COUNT)


def fast_span(e: dict[str, Any]) -> bool:
    t0, dt = e.get("t0"), e.get("dt")
    return (type(t0) is float and 0 < t0 < MAX_TIME and type(dt) is float and 0 <= dt <= MAX_DURATION_S
            and type(e.get("c")) is str and type(e.get("name", "?")) is str)


def fast_counter(e: dict[str, Any]) -> bool:
    t, sec, calls = e.get("t"), e.get("s"), e.get("calls")
    return (type(t) is float and 0 < t < MAX_TIME and type(sec) is float and 0 <= sec <= MAX_DURATION_S
            and type(calls) is int and 0 <= calls < MAX_COUNT and type(e.get("name")) is str
            and _cpu_ok(e.get("cpu")) and _cpu_ok(e.get("tcpu")) and _cpu_ok(e.get("rdelay")))


def _cpu_ok(v: Any) -> bool:
    return v is None or (type(v) is float and 0 <= v <= MAX_DURATION_S)


def clean_event(e: Any) -> dict[str, Any] | None:
    """The event if the analysis can use it as is, else None (malformed)."""
    if type(e) is not dict:
        return None
    kind = e.get("k")
    if type(kind) is not str:
        return None
    spec = EVENT_FIELDS.get(kind)
    if spec is None:
        return e  # a kind not checked here: read.py keeps it only if in KNOWN_KINDS
    required, optional = spec
    for key, check in required.items():
        if key not in e or not check(e[key]):
            return None
    for key, check in optional.items():
        if key in e and not check(e[key]):
            return None
    if kind == "batch" and e["pad"] > e["tokens"]:
        return None
    if kind == "trainer" and "args" in e:
        args = e["args"]
        for key, check in _TRAINER_ARG_CHECKS.items():
            if key in args and args[key] is not None and not check(args[key]):
                args[key] = None
    return e


# Sample rows: "t" is required; a bad figure becomes null (the rest of the row is still good).
_HOST_NUMBERS = ("cpu_proc_pct", "cpu_main_pct", "rss_mib", "read_mib_s", "write_mib_s", "cpu_total_pct",
                 "iowait_pct", "disk_read_mib_s", "disk_write_mib_s", "mem_available_mib", "n_procs", "n_cpus")
_GPU_NUMBERS = ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "sm_clock_mhz", "pcie_tx_kib_s",
                "pcie_rx_kib_s", "proc_mem_mib")


def clean_host_row(row: Any) -> dict[str, Any] | None:
    if type(row) is not dict or not is_time(row.get("t")):
        return None
    for key in _HOST_NUMBERS:
        if key in row and row[key] is not None and not is_number(row[key]):
            row[key] = None
    cores = row.get("cpu_percore_pct")
    if cores is not None and not (type(cores) is list and all(is_number(x) for x in cores)):
        row["cpu_percore_pct"] = None
    if "procs" in row and type(row["procs"]) is not dict:
        row["procs"] = None
    if "others" in row:
        others = row["others"]
        row["others"] = [o for o in others if type(o) is dict and type(o.get("name")) is str
                         and is_number(o.get("pct"))][:20] if type(others) is list else None
    return row


def clean_gpu_row(row: Any) -> dict[str, Any] | None:
    if type(row) is not dict or not is_time(row.get("t")):
        return None
    gpus = row.get("gpus")
    if type(gpus) is not list:
        return None
    kept = []
    for g in gpus:
        if type(g) is not dict or not is_count(g.get("index")):
            continue
        for key in _GPU_NUMBERS:
            if key in g and g[key] is not None and not is_number(g[key]):
                g[key] = None
        if "name" in g and g["name"] is not None and type(g["name"]) is not str:
            g["name"] = None
        g["lost"] = g.get("lost") is True
        kept.append(g)
    row["gpus"] = kept
    return row


_META_CHECKS: dict[str, tuple[Check, Any]] = {
    "mode": (is_str, "run"),
    "command": (is_str_list, []),
    "pid": (opt(is_int), None),
    "started_at": (opt(is_str), None),
    "start_time": (opt(is_time), None),
    "start_note": (opt(is_str), None),  # why the recording starts where it does, where that is not the process's start
    "end_time": (opt(is_time), None),
    "status": (is_str, "partial"),
    "exit_code": (opt(is_int), None),
    "host": (is_dict, {}),
    "gpus": (lambda v: type(v) is list and all(type(g) is dict for g in v), []),
    "nvml_problems": (is_str_list, []),
    "price_per_gpu_hour": (opt(lambda v: is_number(v) and v >= 0), None),
    "gpus_option": (opt(lambda v: is_count(v) and v > 0), None),
    # the doctor's readings of its wall and monotonic clocks (at the start and the end): clock steps
    "clock": (lambda v: type(v) is list and len(v) <= 8 and all(type(x) is dict and is_time(x.get("t"))
                                                                 and is_number(x.get("m")) for x in v), []),
}


def clean_meta(meta: dict[str, Any]) -> list[str]:
    """Replace meta.json values of the wrong type by their defaults; returns the fields fixed."""
    fixed = []
    for key, (check, default) in _META_CHECKS.items():
        if key in meta and not check(meta[key]):
            meta[key] = default
            fixed.append(key)
    host = meta.get("host") or {}
    if "cpu_count" in host and not opt(is_count)(host["cpu_count"]):
        host["cpu_count"] = None
        fixed.append("host.cpu_count")
    kept = [g for g in meta.get("gpus") or [] if is_count(g.get("index")) and opt(is_str)(g.get("name"))
            and opt(is_number)(g.get("memory_total_mib"))]
    if len(kept) != len(meta.get("gpus") or []):
        meta["gpus"] = kept
        fixed.append("gpus")
    start, end = meta.get("start_time"), meta.get("end_time")
    if start is not None and end is not None and end < start:
        meta["end_time"] = None
        fixed.append("end_time")
    return fixed
