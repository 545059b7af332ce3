"""One synthetic text corpus and BPE builder, for the replay and for the acceptance probes.

Words come from one lexicon: common English words, then pronounceable pseudo-words, drawn
with Zipf frequencies, so a BPE trained on the text learns most words whole and token counts
track word counts. Two shapes are drawn from it:

- :func:`generate`: records whose length follows a replay config's distribution; when lengths
  are asked in tokens and a tokenizer is known, each word's token cost is used so example
  lengths match the requested distribution closely. Example ``i`` is the same for any
  ``count >= i`` and the same ``seed``.
- :func:`make_corpus`: English-like documents (sentences, commas, full stops) with lognormal
  word counts, the probes' training text.

:func:`train_bpe` is the byte-level BPE both train on it. Standard library only at import (the
probes import this inside the patient, where startup is measured); ``tokenizers`` is imported
by :func:`train_bpe` alone.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.replay.config import LengthDist

LEXICON_SIZE = 1500

_COMMON_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if so no will more can out about up some what into them than only other its time new "
    "these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take "
    "three model data train loss batch token layer value system result small large number"
)
_COMMON = _COMMON_TEXT.split()
_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "cl", "dr", "fr", "gr", "pl", "pr", "sh", "st", "str", "th", "tr", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "io"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "st", "ng", "ck", "rd"]
_SUFFIXES = ["", "", "", "s", "ed", "ing", "er", "ly", "tion", "ment", "ness", "able", "al"]


def make_lexicon(rng: random.Random, n_words: int) -> list[str]:
    """The common English words, then distinct pseudo-words of 1-3 syllables drawn from ``rng``."""
    words = list(_COMMON)
    seen = set(words)
    while len(words) < n_words:
        n_syl = rng.choice((1, 1, 1, 2, 2, 2, 3))
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                    for _ in range(n_syl)) + rng.choice(_SUFFIXES)
        if 2 <= len(w) <= 12 and w not in seen:
            seen.add(w)
            words.append(w)
    return words


def zipf_cumulative(n: int) -> list[float]:
    """Cumulative Zipf weights ``1 / (rank + 2.7)`` over ``n`` words (a flatter head than 1/rank)."""
    cum, acc = [], 0.0
    for r in range(n):
        acc += 1.0 / (r + 2.7)
        cum.append(acc)
    return cum


def lexicon(size: int = LEXICON_SIZE, seed: int = 1234) -> list[str]:
    """``size`` distinct words (same list for the same seed)."""
    return make_lexicon(random.Random(seed), size)


def make_corpus(
    n_docs: int,
    seed: int = 0,
    median_words: float = 40.0,
    sigma: float = 0.7,
    min_words: int = 3,
    max_words: int = 4000,
    lexicon_size: int = 2500,
) -> list[str]:
    """Deterministic English-like documents; word counts ~ lognormal(median, sigma), clipped.

    Words follow the Zipf law over the lexicon, grouped into capitalised sentences with commas
    and full stops. The probes' ground truth depends on this text: keep it byte for byte.
    """
    rng = random.Random(f"corpus-{seed}-{lexicon_size}")
    lex = make_lexicon(rng, lexicon_size)
    cum = zipf_cumulative(len(lex))
    mu = math.log(median_words)
    docs = []
    for _ in range(n_docs):
        n = int(round(rng.lognormvariate(mu, sigma)))
        n = max(min_words, min(max_words, n))
        words = rng.choices(lex, cum_weights=cum, k=n)
        out, i = [], 0
        while i < n:
            k = rng.randint(6, 18)
            sent = words[i:i + k]
            i += k
            if len(sent) > 6 and rng.random() < 0.4:
                j = rng.randint(2, len(sent) - 2)
                sent[j] = sent[j] + ","
            sent[0] = sent[0].capitalize()
            out.append(" ".join(sent) + rng.choice(".........?!"))
        docs.append(" ".join(out))
    return docs


def train_bpe(texts: Sequence[str], vocab_size: int, special_tokens: Sequence[str],
              unk_token: str | None = None) -> Any:
    """A byte-level BPE (``tokenizers.Tokenizer``) trained on ``texts``, offline."""
    from tokenizers import (  # heavy: only when training
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=unk_token) if unk_token else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


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
    cum = zipf_cumulative(len(words))
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
