"""Time the recorded model at the width that ran and narrower ones, when the steps cannot say.

A padding fix changes the row width; what that saves is how a step's time scales with width on
this machine. Where the recorded batches vary in width the steps are fitted
(:func:`gpudoctor.analysis.workload.fit`); where every batch had one width there is no second
point, and FLOPs alone are wrong both ways (a CPU's attention softmax and masks cost more than
their FLOPs; a GPU's kernel launches cost the same at any width). So, after the training exited,
a child times the recorded ``transformers`` architecture, random weights, forward and backward,
at the recorded rows and a few widths, on the training's device, threads and autocast dtype
(:mod:`gpudoctor.launch.length_cost_worker`), within :data:`BUDGET_S`, in up to three forked
draws whose shape is kept as their median (:mod:`gpudoctor.launch.draws`: one process is one
draw, and draws differ by more than a band's width). The points go to
``length_cost.json`` in the run folder (:mod:`gpudoctor.recording.length_cost`); the padding rule
fits them and says the prediction's basis. A model of the user's own class is never run: a GPT-2 of
its recorded shape stands in, for its cost per token and token² only (the rule keeps the
training's own fixed cost per batch). The sizes come from a recording, so the child first counts
the parameters they build on the meta device and refuses more than twice what the training had.
Anything else (no shape, a timeout, timings a busy machine bent) leaves the file out and the
FLOPs stand, said as such.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.workload import MIN_WIDTH_SPREAD
from gpudoctor.common import batchlengths
from gpudoctor.launch import draws, timing_child
from gpudoctor.recording import length_cost
from gpudoctor.recording.length_cost import LengthCost, LengthPoint

BUDGET_S = 25.0  # the child's timing budget, all its draws; it is stopped at twice that, with its start
MIN_PAD_SHARE = 0.10  # below this share of pad tokens no padding fix is prescribed: nothing to time
MIN_WIDTH = 16
FRACTIONS = (1, 2, 4, 8, 16)  # the width that ran, and these fractions of it


def job(a: Analysis) -> dict[str, Any] | None:
    """What to time for this recording, or None when the steps suffice or nothing can be built."""
    p = a.primary
    if p is None or a.rec.length_cost is not None or not p.batches:
        return None
    cfg: Mapping[str, Any] = p.torch_cfg or {}
    built = architecture(p.model or {})
    if built is None:
        return None
    pad = a.padding()
    if (pad.get("pad_fraction") or 0.0) < MIN_PAD_SHARE:
        return None
    widths = [int(b["seq_len"]) for b in p.batches if int(b.get("seq_len") or 0) > 0]
    if not widths or max(widths) >= MIN_WIDTH_SPREAD * min(widths):
        return None  # the steps show several widths: fitted from the training's own time
    width = Counter(widths).most_common(1)[0][0]
    if built["stand_in"]:
        built["config"]["n_positions"] = width
    rows = Counter(batchlengths.rows(b) or max(1, int(b["tokens"]) // width) for b in p.batches).most_common(1)[0][0]
    device = str(cfg.get("device") or "cpu")
    return {
        **built, "rows": rows, "params": _params(p.model or {}), "device": "cuda" if device == "cuda" else "cpu",
        "widths": widths_to_time(width, p.batches, pad.get("p99_length")),
        "threads": cfg.get("threads"), "autocast": cfg.get("autocast_dtype") if cfg.get("autocast") else None,
        "budget_s": BUDGET_S,
    }


def measure(a: Analysis, folder: Path) -> str | None:
    """Time what :func:`job` asks for, keep it in ``folder`` and on ``a.rec``; never raises.

    Returns a note when the timing was wanted and failed (the report says the FLOPs stood), else None.
    """
    wanted = job(a)
    if wanted is None:
        return None
    try:
        doc = timing_child.run("gpudoctor.launch.length_cost_worker", wanted, BUDGET_S)
    except timing_child.Failed as exc:
        if exc.timed_out:
            return "timing the model at other row widths took too long; the padding prediction uses its FLOPs"
        return f"timing the model at other row widths failed ({exc}); the padding prediction uses its FLOPs"
    if not isinstance(doc, dict):
        return "timing the model at other row widths failed (no figures); the padding prediction uses its FLOPs"
    answered = doc.get("draws")
    drawn = [d for d in map(parse_draw, answered if isinstance(answered, list) else []) if len(d) >= 2]
    if not drawn:
        why = str(doc.get("error") or "fewer than two widths timed")[:200]
        return f"timing the model at other row widths failed ({why}); the padding prediction uses its FLOPs"
    kept = [d for d in drawn if _monotone(d)]
    if not kept:
        return ("timing the model at other row widths gave the narrowest rows a longer pass than the widest "
                "(a busy machine?); "
                "the padding prediction uses its FLOPs")
    points = points_of(kept, int(wanted["rows"]))
    cost = LengthCost(points, wanted["device"], wanted["threads"], wanted["shown"], wanted["autocast"],
                      wanted["stand_in"], draws=len(kept))
    with contextlib.suppress(OSError):  # the report still uses it; a later ``report`` falls back to the FLOPs
        length_cost.write(folder, cost)
    a.rec.length_cost = cost
    return None


Draw = tuple[LengthPoint, ...]  # one forked draw's points, as parsed once


def points_of(draws_kept: Sequence[Draw], rows: int) -> tuple[LengthPoint, ...]:
    """The kept draws' median curve (:func:`gpudoctor.launch.draws.median_ratios`), and on a GPU the
    kernels' curve beside it where every draw timed them at every width (a curve of some widths, or
    of some draws, is left out whole: the passes stand alone)."""
    passes = [{float(q.width): q.seconds for q in d} for d in draws_kept]
    kernels = [{float(q.width): q.kernel_s for q in d if q.kernel_s} if all(q.kernel_s for q in d) else {}
               for d in draws_kept]
    kernel_s = draws.median_ratios(kernels) if kernels and all(kernels) else {}
    points = tuple(LengthPoint(rows, int(w), s, kernel_s.get(w)) for w, s in draws.median_ratios(passes).items())
    if all(q.kernel_s for q in points):
        return points
    return tuple(LengthPoint(q.rows, q.width, q.seconds) for q in points)


NOISE = 1.10  # the narrowest width may time up to 10% above the widest (timer noise), no more


def parse_draw(points: object) -> Draw:
    """One draw's points, from the worker's ``[[rows, width, seconds(, kernel seconds)]...]``, checked
    once as the file is (a draw with a bad row is left out whole: no points)."""
    parsed = length_cost.parse({"schema": length_cost.SCHEMA, "points": points})
    return parsed.points if parsed else ()


def _monotone(draw: Draw) -> bool:
    """A pass never gets slower as its rows get narrower: where the narrowest timed above the widest,
    the draw measured the machine's other work, not the model, and is not kept. Between them
    noise is allowed (a GPU bound by its kernel launches times every narrow width alike)."""
    narrow, wide = min(draw, key=lambda q: q.width), max(draw, key=lambda q: q.width)
    return narrow.seconds <= NOISE * wide.seconds


def widths_to_time(width: int, batches: Sequence[Mapping[str, Any]], p99: object) -> list[int]:
    """The width that ran first (it is known to fit), then the widths a padding fix goes to, then
    fractions of the width that ran, so a budget that runs out leaves out the least needed.

    The fix's widths are where the prediction is read: each batch padded to its longest row (their
    median first: most batches after the fix are near it; then their widest) and a cap at the rows'
    p99. The curve goes through every width timed (:meth:`gpudoctor.analysis.workload.Fit._anchor`),
    so the one the fix's batches sit at is timed first: a pass at 1024 took a fifth of the budget,
    696 and 640 the rest, and the fix's rows averaged 560. On a CPU a step's time is not quadratic
    in width at every width (at 1024 the attention's scores outgrow the caches: 6.9 s a pass against
    1.5 s at 512, 4.5×), so a curve through the width that ran and its half, all a 25 s budget
    allowed for a slow pass, put the compute after at 0.22× of today's where the rows go to 222-460.
    """
    tops = sorted(t for t in (batchlengths.longest(b) for b in batches) if t)
    fix = [tops[len(tops) // 2], tops[-1]] if tops else []
    if isinstance(p99, int) and not isinstance(p99, bool):
        fix.append(p99)
    wanted = [-(-w // 8) * 8 for w in fix if 0 < w < width]
    fractions = [width // f // 8 * 8 for f in FRACTIONS[1:]]
    out: list[int] = [width]
    for w in wanted[:1] + sorted(set(wanted[1:]), reverse=True) + fractions:
        w = max(MIN_WIDTH, w)
        if w < width and w not in out:
            out.append(w)
    return out


def architecture(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model to time: the recorded ``transformers`` class from its config, else a GPT-2 of the
    recorded shape (layers, width, the weights' count) standing in for a model of the user's own
    class, whose code the doctor never runs; None when neither is known."""
    config, name = model.get("config"), model.get("class")
    if isinstance(config, dict) and isinstance(config.get("model_type"), str) and _class_name(name):
        return {"model": name, "config": config, "stand_in": False, "shown": name}
    shape = model.get("shape")
    if not isinstance(shape, dict) or shape.get("attention") is not True:
        return None
    layers, hidden, weights = shape.get("n_layers"), shape.get("hidden"), shape.get("matmul_params")
    if not all(isinstance(x, int) and x > 0 for x in (layers, hidden, weights)):
        return None
    assert isinstance(layers, int) and isinstance(hidden, int) and isinstance(weights, int)
    vocab = max(256, (weights - 12 * layers * hidden * hidden) // hidden)  # the output head's rows
    heads = max(1, hidden // 64) if hidden % 64 == 0 else 1
    shown = name if _class_name(name) else "the model"
    return {"model": "GPT2LMHeadModel", "stand_in": True, "shown": shown,
            "config": {"model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads,
                       "vocab_size": vocab}}


def _params(model: Mapping[str, Any]) -> int | None:
    """The training's parameter count (the child builds no more than twice it)."""
    n = model.get("params")
    return n if isinstance(n, int) and n > 0 else None


def _class_name(name: object) -> bool:
    """A plain identifier that could be a ``transformers`` export (the worker checks it is one)."""
    return isinstance(name, str) and name.isidentifier() and not name.startswith("_") and len(name) <= 80
