"""How many before/after pairs a ``try`` measures, and in which order each pair runs its two sides.

Why: one pair is two runs minutes apart, and a shared or virtual machine's speed moves between
runs by more than many fixes give (on this project's 2-core VM one command's steps/s moved 1.8x
between runs, in stretches of minutes: docs/try.md). A first pair whose speedup is not close to
the prediction is either the machine or the prediction; two more pairs, the second one trial
first, tell which, and the median of three is what one moved pair cannot move. Close is half the
promise, not all of it: one pair's ratio is two runs' draws, and on that VM a run's steps/s
spreads with a standard deviation of 5-7% (22 runs of one eval-heavy loop, bare and doctored
alike: docs/benchmarks.md, thirty-fifth session), so a pair 10-20% from the prediction cannot
tell a prediction that holds from one 20% out (a try whose pair read 2.95x where 2.48x was
predicted: the bare pairs gave 2.40x). A first pair that agrees is not checked again
(``--pairs N`` measures N whatever they show). Kept light: the CLI imports it to write its help.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.rules.knobs import Prediction

PROMISE = 0.20  # a prediction is meant to hold within this share of the speedup measured
AGREE = PROMISE / 2  # a first pair this close to the prediction stands alone (one pair's spread: above)
PAIRS = 3  # the first pair and two more: the median of three outvotes one pair the machine moved


def pairs_wanted(asked: int | None, prediction: Prediction | None, first: float | None) -> tuple[int, str | None]:
    """The pairs to measure in all, and why more than one when ``--pairs`` was not given.

    ``asked``: ``--pairs N`` (then exactly N), or None; ``first``: the first pair's speedup (None:
    not measured, and nothing to confirm)."""
    if asked is not None:
        return asked, None
    if prediction is None or prediction.speedup is None or first is None or first <= 0:
        return 1, None
    low = prediction.speedup
    high = prediction.up_to if prediction.up_to is not None else low
    if low <= (1 + AGREE) * first and high >= (1 - AGREE) * first:
        return 1, None
    said = f"{low:.2f}x" if high == low else f"{low:.2f}-{high:.2f}x"
    return PAIRS, (f"The first pair measured {first:.2f}x where {said} was predicted, more than {AGREE:.0%} apart: "
                   f"{PAIRS - 1} more pairs ran to tell the machine's own drift between runs from the prediction's "
                   "error (--pairs 1 runs one pair only).")


def order(k: int) -> tuple[str, str]:
    """Pair ``k``'s sides in the order they run: the odd pairs (the first is the report's own
    baseline, which must come first) baseline first, the even ones trial first."""
    return ("trial", "baseline") if k % 2 == 0 else ("baseline", "trial")
