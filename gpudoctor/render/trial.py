"""The ``trial`` section (``gpudoctor try``) as display rows: predicted vs achieved, side by side.

Shared by the HTML and Markdown renderers and ``gpudoctor try``'s terminal line; a section in an
unexpected shape (a hand-edited report.json) renders as nothing rather than failing the page.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.core.schema import Trial
from gpudoctor.render.base import num


def view(section: Trial | None) -> dict[str, Any] | None:
    """Display strings: title, rows (figure, baseline, trial), applied and not-applied lines, notes."""
    if not isinstance(section, dict):
        return None
    try:
        return _view(section)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def ran(s: Trial) -> bool:
    """Did the trial set anything: through the hooks (``applied``) or the script's own flags?"""
    return bool(s.get("applied")) or bool((s.get("values") or {}).get("command_line"))


def _view(s: Trial) -> dict[str, Any]:
    base, trial = s.get("baseline") or {}, s.get("trial") or {}
    applied = [f"{row['call']}: " + ", ".join(f"{k}={_show(v)} (was {_show((row.get('was') or {}).get(k))})"
                                              for k, v in (row.get("values") or {}).items())
               for row in s.get("applied") or [] if row.get("values")]
    flags = (s.get("values") or {}).get("command_line")
    if isinstance(flags, dict) and flags:
        applied.append("your command line: " + " ".join(k if v is True else f"{k} {_show(v)}" for k, v in flags.items()))
    missing = [f"{row.get('call') or 'script'}: {row.get('key')}: {row.get('reason')}"
               for row in s.get("not_applied") or []]
    rows = [("steady-state steps/s", _fmt(s.get("baseline_steps_per_s")), _fmt(s.get("trial_steps_per_s"))),
            ("steps measured (after warm-up)", _int(base.get("steps")), _int(trial.get("steps"))),
            ("window (s of training)", _fmt(base.get("window_s"), 1), _fmt(trial.get("window_s"), 1))]
    if s.get("pairs"):  # --pairs N: the steps/s above are each side's median
        rows[0] = ("steady-state steps/s (median of the pairs)", *rows[0][1:])
        rows += [(f"pair {k}: steps/s ({_x(p.get('speedup'), None)})" if p.get("unmeasured") is None
                  else f"pair {k}: {p.get('unmeasured')}",
                  _fmt(p.get("baseline_steps_per_s")), _fmt(p.get("trial_steps_per_s")))
                 for k, p in enumerate(s.get("pairs") or [], 1)]
    return {
        "title": f"{s.get('rule')}: " + (speedups(s) if ran(s) else "nothing applied, no trial run"),
        "predicted": _x(s.get("predicted_speedup"), s.get("predicted_speedup_range")),
        "achieved": _x(s.get("achieved_speedup"), None),
        "basis": str(s.get("prediction_basis") or ""),
        "rows": rows if ran(s) else [],
        "applied": applied,
        "not_applied": missing,
        "notes": [str(n) for n in s.get("notes") or []],
    }


def speedups(section: Trial) -> str:
    """``predicted 1.20x, achieved 1.15x (steps/s 8.10 -> 9.30)``: the title here, the terminal line in try."""
    rng = section.get("predicted_speedup_range")
    predicted = section.get("predicted_speedup")
    if isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, (int, float)) for x in rng):
        said = f"predicted {rng[0]:.2f}-{rng[1]:.2f}x"
    else:
        said = f"predicted {predicted:.2f}x" if isinstance(predicted, (int, float)) else "no prediction"
    achieved = section.get("achieved_speedup")
    b, t = section.get("baseline_steps_per_s"), section.get("trial_steps_per_s")
    got = f"achieved {achieved:.2f}x" if isinstance(achieved, (int, float)) else "achieved n/a"
    measured = [x for x in (num(p.get("speedup")) for p in section.get("pairs") or []) if x is not None]
    if isinstance(achieved, (int, float)) and len(measured) > 1:
        got += f" (median of {len(measured)} pairs, {min(measured):.2f}-{max(measured):.2f}x)"
    unmeasured = section.get("unmeasured")
    rates = (f" (steps/s {b:.2f} -> {t:.2f})" if isinstance(b, (int, float)) and isinstance(t, (int, float))
             else f" ({unmeasured})" if isinstance(unmeasured, str) and unmeasured
             else " (steady-state steps/s unavailable: too few steps; raise --seconds)")
    return f"{said}, {got}{rates}"


def _x(value: Any, rng: Any) -> str:
    if isinstance(rng, list) and len(rng) == 2 and all(num(v) is not None for v in rng):
        return f"{rng[0]:.2f}-{rng[1]:.2f}x"
    return f"{value:.2f}x" if num(value) is not None else "n/a"


def _fmt(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if num(value) is not None else "n/a"


def _int(value: Any) -> str:
    return str(int(value)) if num(value) is not None else "n/a"


def _show(value: Any) -> str:
    """A string in quotes, told apart from a number; not ``repr()``, whose doubled backslashes
    would undo the Markdown escapes made before the view (``\\[`` opens a live link again)."""
    return f"'{value}'" if isinstance(value, str) else str(value)
