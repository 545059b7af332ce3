"""What an ``attach`` session could see, said in the report itself (JSON, HTML, Markdown).

meta.json records the session; a reader of the report needs three things from it
next to the figures: what was loaded into which process (hooks, or stack samples
only), from when (the process's age at the attach, when the hooks went in, where
the report's window starts), and which figures are estimated or unavailable. The
lines go to the report's ``attach`` section and to its ``notes``, which every
renderer prints; the timeline counts seconds since the attach.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.numbers import iso_utc, num
from gpudoctor.core import schema

# What stack samples alone cannot tell (said by the report and by the attach session's notes).
UNAVAILABLE_WITHOUT_HOOKS = (
    "step count and step times, padding, DataLoader settings and the exact data wait are unavailable"
)


def attach_time(meta: dict[str, Any]) -> float | None:
    """When the doctor attached (epoch s), or None for a run that was not an attach."""
    return num(meta.get("attach_time")) if meta.get("mode") == "attach" else None


def process_age_s(meta: dict[str, Any]) -> float | None:
    """How old the process attached to was at the attach (its first target's creation)."""
    at = attach_time(meta)
    targets = [t for t in (meta.get("attach") or {}).get("targets") or [] if isinstance(t, dict)]
    born = [c for t in targets if (c := num(t.get("create_time"))) is not None]
    root = num((meta.get("attach") or {}).get("root_start_time"))
    born += [root] if root is not None else []
    if at is None or not born:
        return None
    return max(0.0, at - min(born))


def attach_section(meta: dict[str, Any], window_start: float) -> schema.Attach | None:
    at = attach_time(meta)
    if at is None:
        return None
    info = meta.get("attach") or {}
    targets = [t for t in info.get("targets") or [] if isinstance(t, dict)]
    age = process_age_s(meta)
    loaded = [_loaded_line(t, at) for t in targets] or [
        "In-process hooks not loaded ("
        + ("--no-inject was given" if info.get("inject") is False else "no Python training process was hooked")
        + "); everything was seen through stack samples."]
    hooked = [t for t in targets if num(t.get("installed_at")) is not None]
    estimated: list[str] = []
    if not hooked:
        samples = info.get("stack_samples") or 0
        estimated.append(f"The breakdown is estimated from {samples} stack samples; "
                         f"{UNAVAILABLE_WITHOUT_HOOKS}.")
    elif len(hooked) < len(targets):
        estimated.append("Processes without hooks are estimated from stack samples.")
    start_s = window_start - at
    if start_s < -0.5:
        window = (f"The report's window starts at the process's launch, {-start_s:.1f} s before the attach: "
                  "it had not taken its first training step, so those seconds count as startup, though what "
                  "they went to was seen only from the attach on.")
    elif start_s > 0.5:
        window = (f"The report's window starts {start_s:.1f} s after the attach, when the hooks went into a "
                  "process already training: its startup is not included.")
    else:
        window = "The report's window starts at the attach: the process's startup is not included."
    return {
        "attached_at": iso_utc(at),
        "process_age_s": round(age, 3) if age is not None else None,
        "window_start_s": round(start_s, 3),
        "loaded": loaded,
        "window": window,
        "estimated": estimated,
        "notes": [str(n) for n in meta.get("attach_notes") or [] if isinstance(n, str)],
    }


def _loaded_line(t: dict[str, Any], at: float) -> str:
    who = f"pid {t.get('pid')}" + (f" (rank {t['rank']})" if isinstance(t.get("rank"), int) else "")
    installed = num(t.get("installed_at"))
    if installed is None:
        why = t.get("error") or "it did not run the injected code"
        return f"{who}: in-process hooks not loaded ({why}); seen through stack samples only."
    state = ("already training, so its figures start there" if t.get("underway")
             else "before its first training step")
    return (f"{who}: in-process hooks loaded through {t.get('method') or 'the debugger'} "
            f"{installed - at:.1f} s after the attach{_tries(t)}, {state}; stack samples throughout.")


def _tries(t: dict[str, Any]) -> str:
    """`` (2 tries, queued in 31.0 s: load 3.9 per core, ...; 78 s a try)`` where the machine was busy.

    Said when the injection took more than one try or its budget was scaled up; silent on a quiet machine.
    """
    tries, budget_s, factor = t.get("tries"), num(t.get("try_budget_s")), num(t.get("budget_factor"))
    if not isinstance(tries, int) or budget_s is None or (tries <= 1 and (factor or 1.0) <= 1.0):
        return ""
    seen = []
    if (load := num(t.get("load_per_core"))) is not None:
        seen.append(f"load {load:.1f} per core")
    if (delay := num(t.get("run_delay_share"))) is not None:
        seen.append(f"its main thread waited {delay:.0%} of the time for a core")
    queued = num(t.get("queued_s"))
    return (f" ({tries} {'try' if tries == 1 else 'tries'}"
            + (f", queued in {queued:.1f} s" if queued is not None else "")
            + (f": {', '.join(seen)}" if seen else "")
            + f"; up to {budget_s:.0f} s a try)")


def summary_lines(section: schema.Attach) -> list[str]:
    """The section as plain lines for the report's notes (what every renderer prints)."""
    age = section["process_age_s"]
    head = (f"Attached at {section['attached_at'] or 'an unknown time'}"
            + (f", when the process was {age:.1f} s old" if age is not None else "")
            + "; the timeline counts seconds since the attach.")
    return [head, *section["loaded"], section["window"], *section["estimated"]]


def timeline_caption(meta: dict[str, Any]) -> str:
    age = process_age_s(meta)
    if attach_time(meta) is None:
        return "Seconds since launch."
    return "Seconds since the attach" + (f" (the process was {age:.1f} s old then)." if age is not None else ".")
