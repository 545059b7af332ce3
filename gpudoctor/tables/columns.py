"""The tables' columns and their types: one place, so an empty table has the same columns.

Times are seconds since the recording's start (``t_s``, ``start_s``, ``end_s``: the launch for
``gpudoctor run``); durations are seconds (``*_s``). Types are pandas' nullable ones where a
value may be missing (``Int64``, ``boolean``, ``string``), so a missing figure reads as
``<NA>``, never as 0, and the same types come back from parquet.
"""

from __future__ import annotations

from gpudoctor.core.schema import BREAKDOWN_KEYS

# What the samplers write (gpudoctor/samplers/host.py, nvml.py); validate.py nulls a bad one.
HOST_FIGURES = ("cpu_proc_pct", "cpu_main_pct", "cpu_total_pct", "iowait_pct", "rss_mib", "mem_available_mib",
                "read_mib_s", "write_mib_s", "disk_read_mib_s", "disk_write_mib_s", "n_procs", "n_cpus")
GPU_FIGURES = ("util_pct", "mem_used_mib", "mem_total_mib", "proc_mem_mib", "power_w", "sm_clock_mhz",
               "pcie_tx_kib_s", "pcie_rx_kib_s")
STEP_PARTS = ("data_wait", "compute", "checkpoint", "eval")  # a step's seconds, from the breakdown's slices

COLUMNS: dict[str, dict[str, str]] = {
    # one row per host tick, and one per GPU per GPU tick
    "samples": {
        "run": "string", "source": "string", "t_s": "float64", "gpu": "Int64", "gpu_name": "string",
        "lost": "boolean", **dict.fromkeys(HOST_FIGURES, "float64"), **dict.fromkeys(GPU_FIGURES, "float64"),
    },
    # one row per in-process span (hooks), or per run of stack samples (attach without hooks)
    "events": {
        "run": "string", "pid": "int64", "rank": "Int64", "worker": "boolean", "category": "string",
        "name": "string", "start_s": "float64", "end_s": "float64", "duration_s": "float64",
    },
    # one row per optimizer step of each training process
    "steps": {
        "run": "string", "training": "int64", "pid": "int64", "rank": "int64", "step": "int64",
        "start_s": "float64", "end_s": "float64", "duration_s": "float64",
        **{f"{k}_s": "float64" for k in STEP_PARTS},
    },
    # one row per training process: the report's breakdown, in seconds
    "breakdown": {
        "run": "string", "training": "int64", "pid": "int64", "rank": "int64", "start_s": "float64",
        "end_s": "float64", "wall_s": "float64", "first_step_s": "float64", "last_step_s": "float64",
        "steps": "int64", **{f"{k}_s": "float64" for k in BREAKDOWN_KEYS},
    },
}
TABLES = tuple(COLUMNS)
