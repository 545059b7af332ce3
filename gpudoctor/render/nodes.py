"""The ``nodes`` section of a merged multi-node report, as display strings (format-free).

Nodes side by side (their ranks, clock offset, data wait, step time, checkpoint time, the rules
that fired there), then the ranks that waited longest for data, then the clock skew the merge
corrected. The HTML template and :mod:`gpudoctor.render.markdown` print :func:`view`; the
terminal prints :func:`terminal_lines`.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.wording import plural
from gpudoctor.core.schema import NodeEntry, Nodes, Report
from gpudoctor.render.base import fmt_duration, fmt_pct, fmt_step_time, num

MAX_NODE_ROWS = 64
MAX_RANK_ROWS = 32
NODE_HEADER = ["node", "host", "ranks", "clock offset", "data wait (mean / max)", "compute", "communication",
               "p50 step", "checkpoint", "rules fired"]
RANK_HEADER = ["rank", "node", "data wait", "data wait share", "compute share", "communication share", "checkpoint",
               "steps", "p50 step"]


def _ranks_text(ranks: Any) -> str:
    ranks = [r for r in ranks or [] if isinstance(r, int)]
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _offset(node: NodeEntry) -> str:
    off = num(node.get("clock_offset_s"))
    if off is None:
        return "not aligned"
    residual = num(node.get("alignment_residual_s"))
    return _seconds(off, signed=True) + (f" (±{_seconds(residual)})" if residual else "")


def _seconds(value: float, signed: bool = False) -> str:
    """Clock offsets read in ms below a second: a same-rack skew is a few ms."""
    sign = "+" if signed else ""
    return f"{value * 1000:{sign}.1f} ms" if abs(value) < 1 else f"{value:{sign}.3f} s"


def skew_line(section: Nodes) -> str:
    ref = section.get("reference")
    skew = num(section.get("skew_corrected_s"))
    if ref is None or skew is None:
        return "Clocks not aligned: no node's step ends to align on; times are as each node recorded them."
    return (f"Clocks aligned on the job's step ends ({ref}'s clock as the reference): skew corrected "
            f"up to {_seconds(skew)}.")


def view(section: Nodes | None, report: Report) -> dict[str, Any] | None:
    """The nodes table, or None for no section or one a renderer trips on."""
    if not isinstance(section, dict) or not isinstance(section.get("nodes"), list):
        return None
    try:
        return _view(section, report)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


def _view(section: Nodes, report: Report) -> dict[str, Any]:
    nodes = [n for n in section["nodes"] if isinstance(n, dict)]
    rows = [[
        str(n.get("node", "")), str(n.get("host") or "unknown host"), _ranks_text(n.get("ranks")), _offset(n),
        f"{fmt_duration(n.get('data_wait_s'))} / {fmt_duration(n.get('data_wait_s_max'))}",
        fmt_pct((n.get("breakdown") or {}).get("compute")), fmt_pct((n.get("breakdown") or {}).get("communication")),
        fmt_step_time((n.get("step_time_s") or {}).get("p50")), fmt_duration(n.get("checkpoint_s")),
        ", ".join(str(r) for r in n.get("findings") or []) or "none",
    ] for n in nodes[:MAX_NODE_ROWS]]
    per_rank = [r for r in ((report or {}).get("per_rank") or []) if isinstance(r, dict)]
    slowest = sorted(per_rank, key=lambda r: -(num(r.get("data_wait_s")) or 0.0))[:MAX_RANK_ROWS]
    rank_rows = [[
        str(r.get("rank", "")), str(r.get("node", "")), fmt_duration(r.get("data_wait_s")),
        fmt_pct((r.get("breakdown") or {}).get("data_wait")), fmt_pct((r.get("breakdown") or {}).get("compute")),
        fmt_pct((r.get("breakdown") or {}).get("communication")), fmt_duration(r.get("checkpoint_s")),
        str((r.get("steps") or {}).get("count", "")),
        fmt_step_time(((r.get("steps") or {}).get("step_time_s") or {}).get("p50")),
    ] for r in slowest]
    more_nodes = len(nodes) - len(rows)
    more_ranks = len(per_rank) - len(rank_rows)
    return {
        "skew": skew_line(section),
        "header": NODE_HEADER,
        "rows": rows,
        "more": f"{plural(more_nodes, 'more node')} in report.json" if more_nodes > 0 else "",
        "rank_header": RANK_HEADER,
        "rank_rows": rank_rows,
        "rank_caption": (f"The {len(rank_rows)} of {len(per_rank)} ranks that waited longest for data"
                         if more_ranks > 0 else "Every rank, longest data wait first"),
    }


def terminal_lines(report: Report) -> list[str]:
    """A few lines for stderr after a merge: the verdict, the findings, each node, the skew."""
    v = view(report.get("nodes"), report)
    lines = [f"gpudoctor: {report.get('verdict')}"]
    for f in report.get("findings") or []:
        if f.get("severity") != "info":
            lines.append(f"  [{f.get('severity')}] {f.get('rule')}: {fmt_pct(f.get('waste_fraction'), 0)} waste — "
                         f"{f.get('title')}")
    if v is not None:
        for row in v["rows"][:16]:
            lines.append(f"  {row[0]} ({row[1]}) ranks {row[2]}: clock {row[3]}, data wait {row[4]}, communication {row[6]}, "
                         f"p50 step {row[7]}")
        lines.append("  " + v["skew"])
    return lines
