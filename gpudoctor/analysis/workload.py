"""The one workload model: FLOPs per token and per step, for rules, ``try``, ``replay`` and ``sweep``.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B)::

    flops_per_token = k * N + 12 * n_layers * hidden * seq

with ``k = 6`` for full training (forward 2N + backward 4N) and ``k = 4`` for LoRA (frozen
weights need no weight gradients), ``N`` the parameters that multiply every token and ``seq``
the padded row length computed on (the attention term is dropped for an attention-free
model). Gradient checkpointing recomputes one forward pass: ``+ 2 * N + 4 * n_layers * hidden
* seq``. A row of ``seq`` tokens costs ``seq * flops_per_token(seq)``: linear token work plus
quadratic attention.

What a fix saves is a ratio of costs, so the machine's seconds per FLOP cancel; the fit
(:func:`fit`) still gives them, from the run's own step time, for figures in seconds. When the
run shows several row widths, :func:`fit` also fits a per-token and a per-token² coefficient to
the measured steps (on a CPU a narrow model's attention is dominated by the softmax and the
masks, not by its matmul FLOPs); otherwise the FLOPs stand.

Pure arithmetic: no torch, no I/O.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

Rows = tuple[int, int]  # (rows in a batch, the width they are padded to)

# The optimizer step, for the analysis (gpu_timeline) and the replay's cost model alike: fp32 AdamW
# streams 28 bytes per trainable parameter (read p, g, m, v; write p, m, v) at this share of the
# datasheet memory bandwidth.
ADAMW_BYTES_PER_PARAM = 28
BANDWIDTH_EFFICIENCY = 0.7

# Config names of the sizes, in the order HF model families spell them.
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_POSITIONS = ("max_position_embeddings", "n_positions")
_ATTENTION_FREE = ("mamba", "rwkv")  # model_type prefixes with no quadratic attention


@dataclass(frozen=True)
class Shape:
    """The sizes the FLOPs depend on.

    ``params`` is N of the formula: the weights each token is multiplied by (embedding
    lookups cost no FLOPs; a tied output head counts once). ``attention`` is None when the
    recording cannot tell whether the model has a quadratic attention term.
    """

    params: float
    n_layers: int
    hidden: int
    attention: bool | None = True
    source: str = "the recorded model config"


def flops_per_token(shape: Shape, seq_len: float, *, lora: bool = False, recompute: bool = False) -> float:
    """Training FLOPs of one token in a row of ``seq_len`` (PaLM 6N + attention).

    >>> flops_per_token(Shape(1000, 2, 8), 10)  # 6*1000 + 12*2*8*10
    7920.0
    """
    k = 4.0 if lora else 6.0
    attention = 12.0 * shape.n_layers * shape.hidden * seq_len if shape.attention else 0.0
    per_token = k * shape.params + attention
    if recompute:
        per_token += 2.0 * shape.params + attention / 3.0
    return per_token


def row_flops(shape: Shape, seq_len: float, *, lora: bool = False, recompute: bool = False) -> float:
    """Training FLOPs of one row padded to ``seq_len``."""
    return seq_len * flops_per_token(shape, seq_len, lora=lora, recompute=recompute)


def step_flops(shape: Shape, batches: Iterable[Rows], *, lora: bool = False, recompute: bool = False) -> float:
    """Training FLOPs of ``batches``, each ``(rows, width)`` (one step: its micro-batches)."""
    return sum(rows * row_flops(shape, width, lora=lora, recompute=recompute) for rows, width in batches)


@dataclass(frozen=True)
class Fit:
    """Seconds of a batch on this machine: ``per_batch_s + per_token_s * rows*width + per_token2_s * rows*width²``.

    From FLOPs (``basis == "flops"``): both coefficients are the model's FLOPs times the measured
    seconds per FLOP. From several observed widths (``basis == "fitted"``): fitted to the steps.
    From the model timed at several widths on this device (``basis == "measured"``,
    :func:`fit_measured`): fitted to those points, with their fixed part per batch (kernel
    launches, Python) that no width removes.
    """

    per_token_s: float
    per_token2_s: float
    s_per_flop: float | None
    basis: str  # "flops" | "fitted" | "measured"
    samples: int
    per_batch_s: float = 0.0  # measured only: a forward and backward's cost at any width
    # measured only: (width, timed / fitted width-dependent seconds) at each timed width, by width
    anchors: tuple[tuple[float, float], ...] = ()

    def batch_s(self, rows: int, width: float) -> float:
        return self.per_batch_s + rows * width * (self.per_token_s + self.per_token2_s * width) * self._anchor(width)

    def _anchor(self, width: float) -> float:
        """The timed passes' own reading at ``width``: the fitted curve scaled to go through every
        timed width, the scale interpolated between them and held beyond them. On a CPU a pass is
        no quadratic in width (the attention's scores leave the caches), so a curve fitted through
        five widths read the ones between 11-18% low; a fix's widths are read where they were timed."""
        a = self.anchors
        if not a:
            return 1.0
        if width <= a[0][0]:
            return a[0][1]
        for (w0, k0), (w1, k1) in itertools.pairwise(a):
            if width <= w1:
                return k0 + (k1 - k0) * (width - w0) / (w1 - w0)
        return a[-1][1]

    def cost_s(self, batches: Iterable[Rows]) -> float:
        return sum(self.batch_s(rows, width) for rows, width in batches)


def coefficients(shape: Shape, *, lora: bool = False, recompute: bool = False) -> tuple[float, float]:
    """(FLOPs per token, FLOPs per token per token of row length): the formula's two terms."""
    linear = flops_per_token(shape, 0.0, lora=lora, recompute=recompute)
    return linear, flops_per_token(shape, 1.0, lora=lora, recompute=recompute) - linear


MIN_FIT_STEPS = 8
MIN_WIDTH_SPREAD = 1.5  # widest / narrowest batch: below this a quadratic term is not identifiable


def fit(shape: Shape | None, steps: Sequence[tuple[Sequence[Rows], float]], *, lora: bool = False,
        recompute: bool = False) -> Fit | None:
    """The run's cost per batch, from ``steps``: (its batches, its measured compute seconds).

    Several widths (spread ≥ 1.5×, ≥ 8 steps): least squares of the seconds on ``tokens`` and
    ``tokens × width`` (both coefficients kept ≥ 0). Else the FLOPs of ``shape`` times the
    measured seconds per FLOP. None: neither a shape nor enough steps to fit.
    """
    kept = [(list(b), s) for b, s in steps if b and s > 0]
    widths = [w for b, _ in kept for _, w in b]
    if len(kept) >= MIN_FIT_STEPS and widths and max(widths) >= MIN_WIDTH_SPREAD * min(widths):
        fitted = _least_squares(kept)
        if fitted is not None:
            return fitted
    if shape is None:
        return None
    flops = sum(step_flops(shape, b, lora=lora, recompute=recompute) for b, _ in kept)
    seconds = sum(s for _, s in kept)
    s_per_flop = seconds / flops if flops > 0 and seconds > 0 else None
    linear, quadratic = coefficients(shape, lora=lora, recompute=recompute)
    scale = s_per_flop if s_per_flop is not None else 1.0
    return Fit(linear * scale, quadratic * scale, s_per_flop, "flops", len(kept))


def fit_measured(points: Sequence[tuple[int, int, float]]) -> Fit | None:
    """The cost of a batch from forward-and-backward passes timed at several widths:
    ``(rows, width, seconds)`` each. The fixed part ``c`` is kept: it is the batch's own. Each
    point is weighed by its own seconds (relative error): the narrow widths a fix goes to are the
    short passes, where the fixed part shows. The curve is then anchored at every timed width
    (:meth:`Fit._anchor`): a width that was timed reads as timed."""
    coef = _nonneg_fit([(1.0 / s, r * w / s, r * w * w / s, 1.0) for r, w, s in points if s > 0])
    if coef is None:
        return None
    fixed, a, b = coef
    by_width: dict[int, list[float]] = {}
    for r, w, s in points:
        part = r * w * (a + b * w)
        if s > fixed and part > 0:
            by_width.setdefault(w, []).append((s - fixed) / part)
    anchors = tuple((float(w), statistics.median(ks)) for w, ks in sorted(by_width.items()))
    return Fit(a, b, None, "measured", len(points), per_batch_s=fixed, anchors=anchors)


def _least_squares(steps: list[tuple[list[Rows], float]]) -> Fit | None:
    """Non-negative least squares: seconds ≈ c + a·Σ rows·width + b·Σ rows·width².

    ``c`` (per step: the optimizer, a wait) is fitted and left out of the batch cost.
    """
    coef = _nonneg_fit([(1.0, float(sum(r * w for r, w in b)), float(sum(r * w * w for r, w in b)), s)
                        for b, s in steps])
    return Fit(coef[1], coef[2], None, "fitted", len(steps)) if coef is not None else None


def _nonneg_fit(rows: list[tuple[float, float, float, float]]) -> list[float] | None:
    """[c, a, b] of seconds ≈ c + a·x1 + b·x2 over ``rows`` (1, x1, x2, seconds): every subset of
    the three terms is solved and the best one with no negative coefficient kept; None when no
    width-dependent term is left."""
    best: tuple[float, list[float]] | None = None
    for subset in ((0, 1, 2), (1, 2), (0, 1), (0, 2), (1,), (2,)):
        coef = _solve([[row[i] for i in subset] for row in rows], [row[3] for row in rows])
        if coef is None or any(c < 0 for c in coef):
            continue
        full = [0.0, 0.0, 0.0]
        for i, c in zip(subset, coef, strict=True):
            full[i] = c
        sse = sum((row[3] - sum(full[i] * row[i] for i in range(3))) ** 2 for row in rows)
        if best is None or sse < best[0] - 1e-18:
            best = (sse, full)
    if best is None or (best[1][1] <= 0 and best[1][2] <= 0):
        return None
    return best[1]


def _solve(x: list[list[float]], t: list[float]) -> list[float] | None:
    """Ordinary least squares by the normal equations (a handful of unknowns), scaled per column."""
    n = len(x[0])
    scale = [max(abs(row[j]) for row in x) or 1.0 for j in range(n)]
    xs = [[row[j] / scale[j] for j in range(n)] for row in x]
    a = [[sum(r[i] * r[j] for r in xs) for j in range(n)] + [sum(r[i] * ti for r, ti in zip(xs, t, strict=True))]
         for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * p for v, p in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] / scale[i] for i in range(n)]


def shape_from_model_event(event: Mapping[str, Any] | None) -> Shape | None:
    """The shape of a recorded ``model`` event: its parameter walk, else its config, else None."""
    if not event:
        return None
    walk = event.get("shape")
    if isinstance(walk, Mapping):
        n, layers, hidden = walk.get("matmul_params"), walk.get("n_layers"), walk.get("hidden")
        if _pos(n) and _pos(layers) and _pos(hidden):
            att = walk.get("attention")
            return Shape(float(n), int(layers), int(hidden), att if isinstance(att, bool) else None,
                         "the model's parameter shapes")
    config = event.get("config")
    params = event.get("params")
    if isinstance(config, Mapping) and _pos(params):
        layers = _first(config, _LAYERS)
        hidden = _first(config, _HIDDEN)
        if layers and hidden:
            positions = _first(config, _POSITIONS) or 0
            n = max(float(params) - positions * hidden, float(params) / 2)  # position lookups: no FLOPs
            kind = str(config.get("model_type") or "")
            return Shape(n, layers, hidden, not kind.startswith(_ATTENTION_FREE), "the recorded model config")
    return None


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if _pos(value):
            return int(value)
    return None


def _pos(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def infer_shape(params: float) -> tuple[int, int]:
    """(n_layers, hidden) of a typical decoder with ``params``: N ≈ 12·L·d², d/L ≈ 128."""
    hidden = (128 * params / 12) ** (1 / 3)
    hidden = max(128, round(hidden / 128) * 128)
    layers = max(1, round(params / (12 * hidden * hidden)))
    return layers, hidden


def cost_ratio(cost: Fit, before: Sequence[Rows], after: Sequence[Rows]) -> float | None:
    """Cost of ``after`` over cost of ``before`` (1.0: no change); None when nothing to compare."""
    now = cost.cost_s(before)
    return cost.cost_s(after) / now if now > 0 else None


def packed_rows(lengths: Sequence[int], width: int, separator: int = 1) -> list[Rows]:
    """Batches after packing: the real tokens (each row + ``separator``) cut into rows of ``width``,
    as one batch ``(rows, width)``; the cost per step then follows from :class:`Fit`."""
    tokens = sum(length + separator for length in lengths)
    return [(math.ceil(tokens / width), width)] if tokens and width > 0 else []


def batch_size_rows(batches: Sequence[Rows], factor: float) -> list[Rows]:
    """The same widths with ``factor`` times the rows per batch (a batch-size change: work per
    step scales with the rows, the number of steps by ``1 / factor``)."""
    return [(max(1, round(rows * factor)), width) for rows, width in batches]


def linear_and_quadratic(before: Sequence[Rows], after: Sequence[Rows]) -> tuple[float, float]:
    """(token ratio, attention ratio) after/before: the bounds when the model's shape is unknown."""
    tok_now = sum(r * w for r, w in before)
    sq_now = sum(r * w * w for r, w in before)
    tok = sum(r * w for r, w in after) / tok_now if tok_now else 1.0
    sq = sum(r * w * w for r, w in after) / sq_now if sq_now else 1.0
    return tok, sq
