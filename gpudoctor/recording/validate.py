"""Check every line of a recording before the analysis trusts it.

A recording comes from disk: a killed writer, a full disk, another version or
a hand-edited file can leave anything in it. Lines here are checked against the
kinds in :mod:`gpudoctor.recording.events`: an event missing a field the
analysis needs, or with a value of the wrong type, NaN, a negative duration or
an absurd number, is dropped (and counted, for a note in the report) rather
than allowed to crash or skew the analysis. Unknown kinds and extra fields are
kept, so newer writers still load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

MAX_TIME = 1e11  # epoch seconds (year ~5100): anything beyond is corrupt
MAX_DURATION_S = 1e7  # ~4 months
MAX_COUNT = 2**53


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


# kind -> (required fields, optional fields); a present optional field must pass too.
EVENT_FIELDS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "span": ({"c": is_str, "t0": is_time, "dt": is_duration}, {"name": is_str}),
    "step": ({"t": is_time}, {"n": is_count, "dt": opt(is_duration)}),
    "first_step": ({"t": is_time}, {}),
    "exit": ({"t": is_time}, {}),
    "detach": ({"t": is_time}, {}),
    "map_cache": ({"t": is_time, "state": is_str}, {}),
    "hook_error": ({"t": is_time, "where": is_str}, {"vital": opt(is_bool), "error": opt(is_str), "message": opt(is_str)}),
    "counter": ({"t": is_time, "name": is_str, "calls": is_count, "s": is_duration},
                {"cpu": is_duration, "tcpu": is_duration, "rdelay": is_duration}),
    "batch": (
        {"tokens": is_count, "pad": is_count, "seq_len": is_count},
        {"t": is_time, "lengths": is_count_list},
    ),
    "proc": (
        {},
        {"t": is_time, "pid": is_int, "ppid": opt(is_int), "rank": opt(is_int), "local_rank": opt(is_int),
         "world_size": opt(is_int), "argv": is_str_list, "create_time": opt(is_time), "is_worker": opt(is_bool),
         "libs": is_libs, "python": opt(is_str)},
    ),
    "loader": (
        {},
        {"t": is_time, "id": opt(is_int), "num_workers": opt(is_count), "batch_size": opt(is_count),
         "pin_memory": opt(is_bool), "prefetch_factor": opt(is_count), "persistent_workers": opt(is_bool),
         "dataset": opt(is_str), "collate_fn": opt(is_str), "params": is_str_list, "pid": opt(is_int),
         "dataset_len": opt(is_count)},
    ),
    "torch_cfg": (
        {},
        {"t": is_time, "cuda": opt(is_bool), "device": opt(is_str), "device_name": opt(is_str),
         "device_capability": opt(is_count_list), "matmul_precision": opt(is_str), "allow_tf32": opt(is_bool),
         "cudnn_allow_tf32": opt(is_bool), "param_dtype": opt(is_str), "autocast": opt(is_bool),
         "autocast_dtype": opt(is_str), "module": opt(is_str), "libs": is_libs},
    ),
    "trainer": (
        {},
        {"t": is_time, "args": is_dict, "max_steps": opt(is_int), "num_train_epochs": opt(is_number),
         "version": opt(is_str)},
    ),
    "model": ({"config": is_dict}, {"t": is_time, "class": opt(is_str), "params": opt(is_count)}),
    "plan": ({}, {"t": is_time, "max_steps": opt(is_int)}),
    "hf_plan": ({}, {"t": is_time, "max_steps": opt(is_int)}),  # the same, as older recordings name it
    "cli": (
        {"options": lambda v: type(v) is list and all(type(o) is dict and is_str(o.get("dest")) for o in v)},
        {"t": is_time, "style": is_str, "parser": opt(is_str), "from_argv": is_bool, "args": opt(is_str_list)},
    ),
    "profiler": (
        {"t0": is_time, "dt": is_duration},
        {"steps": is_count, "dataloader_s": opt(is_duration), "cuda_kernel_s": opt(is_duration)},
    ),
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
        return e  # a kind from a newer writer: kept, unread
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
    "end_time": (opt(is_time), None),
    "status": (is_str, "partial"),
    "exit_code": (opt(is_int), None),
    "host": (is_dict, {}),
    "gpus": (lambda v: type(v) is list and all(type(g) is dict for g in v), []),
    "nvml_problems": (is_str_list, []),
    "price_per_gpu_hour": (opt(lambda v: is_number(v) and v >= 0), None),
    "gpus_option": (opt(lambda v: is_count(v) and v > 0), None),
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
