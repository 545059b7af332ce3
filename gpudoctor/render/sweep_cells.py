"""A sweep point as display cells, shared by the terminal, Markdown and HTML tables (in render/,
so the sweep pages import no mode package; the sweep's progress lines use it too).

A figure that was not measured prints as an em dash, never as 0.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.render.base import fmt_step_time, num

DASH = "—"
COLUMNS: tuple[tuple[str, bool], ...] = (
    ("point", False),
    ("status", False),
    ("samples/s", True),
    ("spread", True),
    ("tokens/s", True),
    ("step", True),
    ("data wait", True),
    ("GPU busy", True),
    ("peak mem", True),
    ("$/M tokens", True),
    ("run $", True),
)


def columns() -> tuple[tuple[str, bool], ...]:
    return COLUMNS


def rate(value: Any) -> str:
    v = num(value)
    if v is None:
        return DASH
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def pct(value: Any) -> str:
    v = num(value)
    return DASH if v is None else f"{100 * v:.0f}%"


def usd(value: Any) -> str:
    text = rate(value)  # the same rounding, with a dollar sign
    return text if text == DASH else f"${text}"


def mib(value: Any) -> str:
    v = num(value)
    if v is None:
        return DASH
    return f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB"


def status_text(point: dict[str, Any]) -> str:
    status = point["status"].replace("_", " ")
    reason = point.get("reason")
    return f"{status}: {reason}" if reason and point["status"] != "ok" else status


def cells(point: dict[str, Any]) -> list[str]:
    m = point.get("metrics") or {}
    c = point.get("cost") or {}
    mem = (
        m.get("peak_gpu_mem_mib")
        if m.get("peak_gpu_mem_mib") is not None
        else m.get("peak_rss_mib")
    )
    label = point["label"] + (" (current)" if point.get("baseline") else "")
    return [
        label,
        status_text(point),
        rate(m.get("samples_per_s")),
        DASH
        if num(m.get("spread")) is None
        else f"±{50 * m['spread']:.0f}%" + (f" ×{m['runs']}" if m.get("runs", 1) > 1 else ""),
        rate(m.get("nonpad_tokens_per_s")),
        fmt_step_time(m.get("step_time_s")) if num(m.get("step_time_s")) is not None else DASH,
        pct(m.get("data_wait_share")),
        pct(m.get("gpu_busy")),
        mib(mem),
        usd(c.get("usd_per_mtok")),
        usd(c.get("run_usd")),
    ]


def line(point: dict[str, Any]) -> str:
    """One point on one terminal line: the figures that were measured, with their units."""
    c = cells(point)
    if point["status"] != "ok":
        return f"{c[0]}  {point.get('reason') or ''}".rstrip()
    spread = f" {c[3]}" if c[3] != DASH else ""
    parts = [
        f"{c[0]}  {c[2]} samples/s{spread}",
        f"{c[4]} tokens/s",
        f"step {c[5]}",
        f"data wait {c[6]}",
        f"GPU busy {c[7]}",
        f"mem {c[8]}",
        f"{c[9]}/M tokens",
        f"run {c[10]}",
    ]
    return " · ".join(p for p in parts if DASH not in p)


def visible(points: list[dict[str, Any]]) -> list[int]:
    """Indices of the columns that hold at least one figure (dollars only when priced)."""
    rows = [cells(p) for p in points]
    return [
        i for i, (_, right) in enumerate(COLUMNS) if not right or any(r[i] != DASH for r in rows)
    ]


def short(key: str) -> str:
    """A config key as a column name: ``training.dataloader_num_workers`` -> ``workers``."""
    names = {
        "training.dataloader_num_workers": "workers",
        "training.per_device_train_batch_size": "batch",
        "training.gradient_accumulation_steps": "accum",
        "training.dataloader_prefetch_factor": "prefetch",
    }
    return names.get(key, key.rsplit(".", 1)[-1])
