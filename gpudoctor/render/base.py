"""The renderer base class and the formatting every renderer shares.

A renderer is a pure function of a report dict (see
:mod:`gpudoctor.core.schema`): ``render(report) -> str``. The helpers here
turn figures into the words users read, the same way in HTML, Markdown and the
diff: a missing figure prints as "unavailable", never as 0.
"""

from __future__ import annotations

import datetime as dt
import json
import keyword
import shlex
import signal
from typing import Any

# Figures and words below the renderers (the diff says them too); the renderers import them from here.
from gpudoctor.common.numbers import num  # noqa: F401
from gpudoctor.common.wording import (  # noqa: F401
    NO_GPU,
    NO_PRICE,
    SLICE_LABELS,
    UNAVAILABLE,
    command_text,
    doctor_fault_words,
    fmt_usd,
    gpus_text,
    plural,
)
from gpudoctor.core.schema import Fix, FixTable, Report, Run, breakdown_items  # noqa: F401

# One colour per slice / span kind, used by the bar, the timeline and the legend
# (Okabe-Ito based, readable for colour-blind users).
SLICE_COLORS = {
    "startup": "#E69F00",
    "data_wait": "#D55E00",
    "compute": "#0072B2",
    "communication": "#F0E442",
    "checkpoint": "#CC79A7",
    "eval": "#009E73",
    "other": "#A8A8A8",
    "format": "#8C6D1F",
    "model_load": "#56B4E9",
}

SEVERITY_COLORS = {"high": "#C62828", "medium": "#E65100", "low": "#B28704", "info": "#546E7A"}


class Renderer:
    """Turns a :class:`~gpudoctor.core.schema.Report` into one output file's text."""

    output_file_extension: str = ""

    def render(self, report: Report) -> str:
        """Return the whole file's text for ``report``."""
        raise NotImplementedError


def fmt_pct(fraction: Any, digits: int = 1) -> str:
    """``0.412`` -> ``"41.2%"``; None -> ``"unavailable"``."""
    f = num(fraction)
    return UNAVAILABLE if f is None else f"{f * 100:.{digits}f}%"


def fmt_duration(seconds: Any) -> str:
    """``3723`` -> ``"1h 02m 03s"``, ``150`` -> ``"2m 30s"``, ``4.25`` -> ``"4.25s"``."""
    s = num(seconds)
    if s is None:
        return UNAVAILABLE
    if s < 60:
        return f"{s:.3g}s" if s < 10 else f"{s:.1f}s"
    whole = round(s)
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def fmt_step_time(seconds: Any) -> str:
    """Step times read best in ms below a second."""
    s = num(seconds)
    if s is None:
        return UNAVAILABLE
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_speedup(factor: Any) -> str:
    """``1.8`` -> ``"1.80×"`` (a throughput factor); None -> ``"unavailable"``."""
    f = num(factor)
    return UNAVAILABLE if f is None else f"{f:.2f}×"


def fmt_finding_speedup(finding: Any) -> str:
    """A finding's one promise: its steady-state speedup (steps/s after the fix over before);
    a fix of startup alone changes no step, so its figure is the whole run's, said as such."""
    steady = num(finding.get("predicted_speedup"))
    if steady is not None:
        return fmt_speedup(steady)
    whole = num(finding.get("whole_run_speedup"))
    return f"{fmt_speedup(whole)} of the whole run" if whole is not None else "not estimated"


def fmt_int(value: Any) -> str:
    """Thousands separators; None -> ``"unavailable"``."""
    v = num(value)
    return UNAVAILABLE if v is None else f"{round(v):,}"


def fmt_value(value: Any) -> str:
    """A figure from ``finding.data`` or ``run.host``: short, never NaN."""
    if isinstance(value, float):
        v = num(value)
        return UNAVAILABLE if v is None else f"{v:.4g}"
    if value is None:
        return UNAVAILABLE
    return str(value)


def fmt_time(iso: Any) -> str:
    """``2026-11-24T01:55:38.664560+00:00`` -> ``2026-11-24 01:55:38 UTC`` (the zone it was written in)."""
    try:
        when = dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso) if iso else "unknown"
    offset, z = when.utcoffset(), when.strftime("%z")
    zone = "" if offset is None else " UTC" if not offset else f" UTC{z[:3]}:{z[3:5]}"
    return when.strftime("%Y-%m-%d %H:%M:%S") + zone


def exit_text(code: Any) -> str:
    """``exit code 1``; above 128, the shell's 128 + N for a signal: ``exit code 137 (signal 9, SIGKILL)``."""
    if not isinstance(code, int) or isinstance(code, bool):
        return "exit code unknown"
    try:
        name = signal.Signals(code - 128).name if code > 128 else None
    except ValueError:
        name = None
    return f"exit code {code}" + (f" (signal {code - 128}, {name})" if name else "")


def outcome_text(run: Run) -> str:
    """How the command ended, when it did not simply finish; "" when it did (or was detached from)."""
    status = str(run.get("status") or "")
    ran = fmt_duration(run.get("duration_s"))
    fault = run.get("doctor_fault")
    if status == "crashed" and fault:  # gpudoctor's code in the traceback: said as ours, never the command's
        words = doctor_fault_words(fault["raised"], fault["frames"], short=True)
        return f"the training crashed with {exit_text(run.get('exit_code'))} {words}; the report covers the {ran} it ran"
    if status == "crashed":
        return f"the command crashed with {exit_text(run.get('exit_code'))}; the report covers the {ran} it ran"
    if status == "interrupted":
        return f"the command was interrupted and ended with {exit_text(run.get('exit_code'))}; the report covers the {ran} it ran"
    if status == "partial":
        return "the recording was cut short (the doctor stopped before the command); the report covers what was recorded"
    return ""


def has_gpu(run: Run) -> bool:
    """NVML described at least one GPU (``gpu_count`` alone is the GPUs priced, e.g. from --gpus)."""
    return bool(run.get("gpus"))


def cores(run: Run) -> int | None:
    """The machine's CPU count, for CPU shares stated as "% of all N cores"."""
    count = num((run.get("host") or {}).get("cpu_count") if isinstance(run.get("host"), dict) else None)
    return int(count) if count else None


def cpu_text(fraction: Any, run: Run) -> str:
    """``shares.cpu_busy`` as ``12.5% of all 8 cores``: one convention in every format."""
    n = cores(run)
    return fmt_pct(fraction) + (f" of all {n} cores" if n and num(fraction) is not None else "")


def host_text(host: Any) -> str:
    """A one-line host description from whatever keys ``run.host`` has."""
    if not isinstance(host, dict):
        return "" if host is None else str(host)
    preferred = ("hostname", "platform", "cpu_count", "memory_total_mib", "python", "torch")
    keys = [k for k in preferred if k in host] or [
        k for k, v in host.items() if isinstance(v, (str, int, float))
    ]
    parts = []
    for k in keys:
        v = host[k]
        if k == "hostname":
            parts.append(str(v))
        elif k == "memory_total_mib" and (mib := num(v)) is not None:
            parts.append(f"{mib / 1024:.0f} GiB RAM")
        elif k == "cpu_count":
            parts.append(f"{v} CPUs")
        else:
            parts.append(f"{k} {fmt_value(v)}")
    return " · ".join(parts)


def startup_text(parts: Any) -> str:
    """``4.1 s: imports 1.3 s, model load 0 s, ...``; unavailable when nothing ran inside."""
    if not isinstance(parts, dict) or num(parts.get("total_s")) is None:
        return "unavailable"
    names = (("imports_s", "imports"), ("model_load_s", "model load"), ("data_load_s", "dataset load"),
             ("format_s", "dataset map"), ("other_s", "other setup"))
    return fmt_duration(parts["total_s"]) + ": " + ", ".join(
        f"{label} {fmt_duration(parts.get(key))}" for key, label in names if num(parts.get(key)) is not None)


def fix_memory_text(fix: Fix) -> str:
    """The predicted peak of a fix that changes the work per step, and the headroom it leaves ("" on
    other fixes): a figure the run could not measure is said unavailable, with why."""
    mem = fix.get("memory")
    if not isinstance(mem, dict):
        return ""
    peak, headroom, limit = num(mem.get("predicted_peak_mib")), num(mem.get("headroom_mib")), num(mem.get("limit_mib"))
    basis = str(mem.get("basis") or "")
    if peak is None or headroom is None or limit is None:
        return f"Predicted peak memory with this fix: unavailable ({basis})."
    return (f"Predicted peak memory with this fix: {peak:,.0f} MiB of the {limit:,.0f} MiB a fix may use, "
            f"{headroom:,.0f} MiB of headroom left ({basis}).")


def fix_tables(fix: Fix) -> list[FixTable]:
    """Every call a fix changes, main first: ``[{"library", "call", "config"}]`` with values."""
    library = fix.get("library")
    call = fix.get("call")
    if call is None and isinstance(library, str) and library.split()[-1:] in (["TrainingArguments"], ["DataLoader"]):
        call = library.split()[-1]  # reports written before fixes named their call
    tables: list[FixTable] = [{"library": library, "call": call, "config": fix.get("config")}]
    tables += [t for t in fix.get("also") or [] if isinstance(t, dict)]
    return [t for t in tables if isinstance(t.get("config"), dict) and t["config"]]


def config_code(config: dict[str, Any] | None, library: str | None, call: str | None = None) -> tuple[str, str]:
    """One table of a fix as ``(language, code)`` that pastes where it belongs.

    A script's flags (keys ``--name``) are one shell line. With a ``call`` (``TrainingArguments``,
    ``DataLoader``, ``ds.map``), keyword arguments inside that call; without one, plain Python
    assignments when the names are identifiers (a loop's own settings), YAML otherwise. Python
    code always parses.
    """
    config = config or {}
    if not config:
        return "text", ""
    header = f"# {library}\n" if library else ""
    if all(isinstance(k, str) and k.startswith("-") for k in config):  # a script's flags
        return "bash", header + " ".join(_flag_text(k, v) for k, v in config.items())
    names_ok = all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in config)
    if call and names_ok and _is_call_name(call):
        lines = [f"    {name}={py_literal(value)}," for name, value in config.items()]
        return "python", header + f"{call}(\n    ...,\n" + "\n".join(lines) + "\n)"
    if names_ok:
        return "python", header + "\n".join(f"{name} = {py_literal(value)}" for name, value in config.items())
    lines = [f"{json.dumps(str(name))}: {json.dumps(value, default=str)}" for name, value in config.items()]
    return "yaml", header + "\n".join(lines)


def _flag_text(flag: str, value: Any) -> str:
    """``--name=value`` (argparse and nanoGPT's configurator both read it), ``-n value``."""
    if flag.startswith("--"):
        return shlex.quote(f"{flag}={value}")
    return shlex.join([flag, str(value)])


def _is_call_name(call: str) -> bool:
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in call.split("."))


def py_literal(value: Any) -> str:
    """A JSON value written the way Python source spells it."""
    if isinstance(value, float) and num(value) is None:
        return "None"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return repr(value)
    return repr(str(value))


def downsample(t: list[Any], values: list[Any], max_points: int) -> tuple[list[float], list[float]]:
    """Bucket-mean ``(t, values)`` to at most ``max_points``; drops non-finite pairs."""
    pairs = [(num(a), num(b)) for a, b in zip(t, values, strict=False)]
    clean = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(clean) <= max_points:
        return [a for a, _ in clean], [b for _, b in clean]
    size = len(clean) / max_points
    ts, vs = [], []
    for i in range(max_points):
        chunk = clean[int(i * size) : int((i + 1) * size)] or [clean[-1]]
        ts.append(sum(a for a, _ in chunk) / len(chunk))
        vs.append(sum(b for _, b in chunk) / len(chunk))
    return ts, vs


def mfu_text(mfu: Any) -> str:
    """``MFU 31.2% (bf16 peak 989 TFLOP/s on h100-sxm)`` or why it is unavailable."""
    if not isinstance(mfu, dict):
        return "unavailable"
    value = num(mfu.get("value"))
    if value is None:
        return f"unavailable: {mfu.get('reason') or 'not measured'}"
    inputs = mfu.get("inputs") or {}
    peak = num(inputs.get("peak_tflops"))
    flops = num(inputs.get("flops_per_step"))
    detail = (f" ({flops / 1e12:.2f} TFLOP per step in {fmt_step_time(inputs.get('gpu_step_s'))} of GPU time, "
              f"{inputs.get('precision')} peak {peak:.0f} TFLOP/s on {inputs.get('gpu')})"
              if peak is not None and flops is not None else "")
    return f"{fmt_pct(value)}{detail}"


def gpu_clock_rows(report: Report) -> list[tuple[str, str]]:
    """The GPU's own clock (CUDA events) and MFU, as label/value rows; MFU always, with its reason."""
    rows = [("MFU", mfu_text(report.get("mfu")))]
    g = report.get("gpu_timeline")
    if not isinstance(g, dict):
        return rows
    host = (g.get("host_breakdown") or {}).get("data_wait")
    rows += [
        ("GPU busy, of GPU step time (CUDA events)", fmt_pct(g.get("busy_fraction"))),
        ("GPU step time, p50", fmt_step_time(g.get("gpu_step_s"))),
        ("data wait: GPU idle / host wait", f"{fmt_step_time(g.get('data_wait_gpu_idle_s'))} / "
                                             f"{fmt_step_time(g.get('data_wait_host_s'))} (host: {fmt_pct(host)} of wall)"),
        ("host syncs per step", f"{num(g.get('syncs_per_step')) or 0:.1f} (GPU idle after them ≤ "
                                f"{fmt_step_time(g.get('sync_idle_s_per_step'))} per step)"),
        ("H2D copy per step", fmt_step_time(g.get("h2d_s_per_step"))),
    ]
    if g.get("host_own_s_per_step") is not None:
        rows.append(("host per step: its own (fetch, launches, Python) / blocked on the GPU",
                     f"{fmt_step_time(g.get('host_own_s_per_step'))} / {fmt_step_time(g.get('host_blocked_s_per_step'))}"))
    if g.get("nvml_verdict"):
        rows.append(("NVML vs events", str(g["nvml_verdict"])))
    return rows
