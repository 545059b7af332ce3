"""Counts and figures in words: ``1 worker``, ``2 workers``, never ``worker(s)``; ``0.0404 s``.

Below every layer that writes text for people (rules, reports, the diff, renderers, notes), so
each says a count, a figure or a run's hardware the same way.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.common.numbers import num

UNAVAILABLE = "unavailable"
NO_PRICE = "no price: pass --price-per-gpu-hour"
NO_GPU = "no GPU on this machine"

# The breakdown's buckets (and the timeline's other spans) as people read them.
SLICE_LABELS = {
    "startup": "startup",
    "data_wait": "data wait",
    "compute": "compute",
    "communication": "communication",
    "checkpoint": "checkpoint",
    "eval": "eval",
    "other": "other",
}
SPAN_LABELS = {**SLICE_LABELS, "format": "dataset map", "model_load": "model load"}


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 problem``, ``2 problems``; ``words`` for an irregular plural (``process``, ``processes``)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def fmt_usd(usd: Any, missing: str = NO_PRICE) -> str:
    """``3.8`` -> ``"$3.80"``; tiny amounts keep a significant digit."""
    v = num(usd)
    if v is None:
        return missing
    if 0 < abs(v) < 0.01:
        return f"${v:.4f}"
    return f"${v:,.2f}"


def fmt_number(value: Any) -> str:
    """Three significant figures, whole numbers from 100 up; None -> ``"unavailable"``."""
    v = num(value)
    if v is None:
        return UNAVAILABLE
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 1e-4 or v == 0 else f"{v:.1e}"


def fmt_seconds(value: Any, unit: str | None = "s") -> str:
    """``0.0404`` -> ``"0.0404 s"`` (or ``"0.0404 s/step"`` with that unit)."""
    text = fmt_number(value)
    return text if text == UNAVAILABLE else f"{text} {unit or 's'}"


def command_text(command: Any) -> str:
    """The command line as one shell-like string."""
    if isinstance(command, (list, tuple)):
        return " ".join(str(a) for a in command)
    return "" if command is None else str(command)


def gpus_text(run: Any) -> str:
    """``"2 × NVIDIA H100 80GB HBM3 (80 GiB)"``, or ``"no GPU seen"``."""
    gpus = run.get("gpus") or []
    if not gpus and run.get("mode") == "replay":  # its GPU figures are the target's, predicted
        return "none here: the replay ran on the CPU; the target GPU is predicted, not measured"
    if not gpus:  # a stated price prices GPU-hours the recording never saw: say both
        count = run.get("gpu_count") or 0
        return f"{NO_GPU} (priced as {plural(count, 'GPU')})" if count else NO_GPU
    names: dict[str, int] = {}
    for gpu in gpus:
        mib = num(gpu.get("memory_total_mib"))
        label = str(gpu.get("name") or "GPU") + (f" ({mib / 1024:.0f} GiB)" if mib else "")
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{n} × {label}" for label, n in names.items())


def bucket_text(f: Any) -> str:
    """``"data wait 0.04 → 0.04 s/step"``: the bucket a diff's finding lives in, before and after."""
    if not f.get("bucket"):
        return "no breakdown seconds claimed"
    b = f["bucket_s"]
    label = SPAN_LABELS.get(f["bucket"], f["bucket"])
    return f"{label} {fmt_number(b['before'])} → {fmt_seconds(b['after'], f['unit'])}"


def in_sentence(title: str) -> str:
    """A finding's title inside a sentence: its first word lowercased, unless it is an acronym
    ("FSDP gathers ...", "DDP searches ..." keep theirs)."""
    first, _, rest = title.partition(" ")
    if len(first) > 1 and first[1:].lower() != first[1:]:
        return title
    return first.lower() + (" " + rest if rest else "")


def hours_text(h: float) -> str:
    """``"40 minutes"``, ``"3.5 hours"``, ``"2.1 days"``: a time left, in the unit a reader plans in."""
    if h < 1:
        return f"{60 * h:.0f} minutes"
    return f"{h:.1f} hours" if h < 48 else f"{h / 24:.1f} days"


HOOKS_OFF = "GPUDOCTOR_HOOKS=0"  # the environment that runs a command under the doctor without its hooks


def doctor_fault_words(raised: bool, frames: list[str], short: bool = False) -> str:
    """A crash with gpudoctor's code in its traceback, said as ours (issue #39): for certain when the
    exception came from our frame, else as the test that tells (a wrapper of ours calls the user's
    function once: the fault is ours if the command does not fail without the hooks). ``frames``: ours,
    outermost first: the one raising names the hook that raised, else the hook the training entered.
    ``short``: the clause a verdict or an outcome line carries; else the sentences under the traceback."""
    where = (frames[-1] if raised else frames[0]) if frames else "gpudoctor"
    if short:
        if raised:
            return f"in gpudoctor's own hook ({where}): gpudoctor's bug, not your command's; {HOOKS_OFF} runs it without the hooks"
        return f"through gpudoctor's hook ({where}): gpudoctor's bug if the command does not fail with {HOOKS_OFF}"
    if raised:
        return (f"gpudoctor: the training crashed in gpudoctor's own hook ({where}), not in your code: this is "
                f"gpudoctor's bug. Run with {HOOKS_OFF} to keep the doctor's hooks out of the training, "
                "and please report it.")
    return (f"gpudoctor: the traceback passes through gpudoctor's hook ({where}). If the command does not fail "
            f"with {HOOKS_OFF} (the doctor's hooks kept out of the training), this is gpudoctor's bug: "
            "please report it.")
