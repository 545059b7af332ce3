"""A deterministic synthetic text dataset with a chosen length distribution.

Words come from a fixed pseudo-word lexicon with Zipf frequencies, so a BPE
trained on the data learns most words whole and token counts track word counts.
When lengths are asked in tokens and a tokenizer is known, each word's token
cost is used so example lengths match the requested distribution closely.
Example ``i`` is the same for any ``count >= i`` and the same ``seed``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable

from gpudoctor.replay.config import LengthDist

_CONSONANTS = "bcdfghklmnprstvz"
_VOWELS = "aeiou"
LEXICON_SIZE = 1500


def lexicon(size: int = LEXICON_SIZE, seed: int = 1234) -> list[str]:
    """``size`` distinct pseudo-words of 1-4 syllables (same list for the same seed)."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        n = rng.choices((1, 2, 3, 4), weights=(2, 5, 3, 1))[0]
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def sample_length(spec: LengthDist, rng: random.Random) -> int:
    """One length from ``spec`` (lognormal with the given arithmetic mean), clipped."""
    if spec.dist == "fixed":
        value = spec.mean
    elif spec.dist == "uniform":
        value = rng.uniform(spec.min, spec.max or 2 * spec.mean)
    else:
        mu = math.log(spec.mean) - spec.sigma**2 / 2
        value = rng.lognormvariate(mu, spec.sigma)
    value = max(spec.min, round(value))
    return min(value, spec.max) if spec.max else value


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """Split ``total`` over ``parts`` fields; the last field (the answer) gets the most."""
    if parts == 1:
        return [total]
    weights = [rng.uniform(0.2, 1.0) for _ in range(parts - 1)] + [rng.uniform(1.0, 3.0)]
    scale = total / sum(weights)
    sizes = [max(1, int(w * scale)) for w in weights[:-1]]
    return [*sizes, max(1, total - sum(sizes))]


def generate(
    count: int,
    spec: LengthDist,
    fields: list[str],
    seed: int = 0,
    word_cost: Callable[[str], int] | None = None,
    overhead_tokens: int = 0,
) -> list[dict[str, str]]:
    """``count`` records with text ``fields`` whose total length follows ``spec``.

    ``word_cost`` (tokens of `` word``) turns a token budget into words;
    ``overhead_tokens`` (the template's own tokens) is taken off each budget.
    """
    words = lexicon()
    cum = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    costs = [word_cost(w) if word_cost else 1 for w in words]
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        budget = sample_length(spec, rng)
        if spec.unit == "tokens":
            budget = max(len(fields), budget - overhead_tokens)
        record = {}
        for name, size in zip(fields, _split(budget, len(fields), rng), strict=True):
            record[name] = _words(size, words, cum, costs, rng, by_cost=spec.unit == "tokens")
        records.append(record)
    return records


def _words(
    size: int,
    words: list[str],
    cum: list[float],
    costs: list[int],
    rng: random.Random,
    by_cost: bool,
) -> str:
    out: list[str] = []
    used = 0
    top = cum[-1]
    while used < size:
        i = bisect.bisect_left(cum, rng.random() * top)
        i = min(i, len(words) - 1)
        cost = costs[i] if by_cost else 1
        if out and used + cost > size:
            break
        out.append(words[i])
        used += cost
    return " ".join(out)
