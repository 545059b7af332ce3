"""Multi-process rules: one rank holding the others back; outdated libraries."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.nodes import slow_node
from gpudoctor.analysis.process import ProcessView
from gpudoctor.common.wording import plural
from gpudoctor.report import schema
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule

# Versions before these miss loader and attention speedups users report (see seeds/002).
MIN_GAP = 0.10  # share of the run the other ranks wait for the slow one
MINIMUM = {"torch": (2, 1), "transformers": (4, 40), "datasets": (2, 19), "accelerate": (0, 30)}
Cause = Literal["tokenizer", "build", "host"]  # what a straggler's own figures point at


@dataclass
class RankData:
    """One rank's own data-path measurements, per training step."""

    rank: int
    steps: int
    wait_s: float  # data wait per step
    fetch_s: float | None  # batch production per batch (dataset + collate, here or in its workers)
    tokenize_s: float  # tokenizer seconds per step
    workers: int | None


@dataclass
class Straggler:
    """Figures of a rank holding its training back; worded by ``_word``."""

    slow: RankData
    others: list[RankData]
    gap: float  # share of the run the others spend waiting for it
    step_s: float | None  # the job's step time now: the pace the slowest rank sets
    freed_s: float  # seconds per step the job gets back when the slow rank waits as the others do
    training: int
    trainings: int
    node: str | None
    others_wait_s: float | None = None  # medians over the other ranks: data wait per step,
    others_fetch_s: float | None = None  # batch build per batch,
    others_tokenize_s: float | None = None  # tokenizer seconds per step

    @property
    def cause(self) -> Cause:
        """What its own figures point at: "tokenizer", "build" or "host" (worded by ``CAUSES``)."""
        return _cause(self)

    @property
    def loop_speedup(self) -> float | None:
        if not self.step_s or self.freed_s <= 0 or self.freed_s >= self.step_s:
            return None
        return self.step_s / (self.step_s - self.freed_s)


class StragglerRank(Rule):
    name = "straggler_rank"
    fires_when = ("one rank's data wait ≥ 10 points above the median of the other ranks of its training "
                  "(every node's ranks, when `gpudoctor report` merges a job's node folders)")
    fix_from = ("that rank's own measurements (batch build time per batch against the other ranks', its "
                "tokenizer time, its workers); the job's step time set by the slowest rank, less its extra wait")

    def match(self, a: Analysis) -> Finding | None:
        found = _straggler(a)
        if found is None:
            return None
        whole = slow_node(a)
        if found.node and whole is not None and whole[0] == found.node:
            return None  # every rank of that node is slow: straggler_node names the host instead
        lead_is_slow = min([found.slow.rank, *(o.rank for o in found.others)]) == found.slow.rank
        return _word(found, sync_claim(a, lead_is_slow, found.gap))


def _straggler(a: Analysis) -> Straggler | None:
    # Only ranks of one job compare: processes that ran together (a training), each rank
    # once. Trainings run one after another, or side by side without distinct ranks, are
    # not ranks holding each other back.
    found: Straggler | None = None
    for i, group in enumerate(a.trainings):
        if len(group) < 2 or len({p.rank for p in group}) < len(group):
            continue
        waits = {p.rank: p.breakdown["data_wait"] for p in group}
        worst = max(waits, key=lambda r: waits[r])
        median = statistics.median(w for r, w in waits.items() if r != worst)
        gap = (waits[worst] - median) * group[0].wall_s / a.duration_s  # as a share of the run
        if gap < MIN_GAP or (found is not None and gap <= found.gap):
            continue
        data = {p.rank: _rank_data(p) for p in group}
        slow, others = data[worst], [d for r, d in sorted(data.items()) if r != worst]
        steps = [p.step_intervals_s() for p in group if len(p.step_times) > 2]
        # Every rank steps at the pace of the slowest (the gradient sync): the job's step time.
        step_s = max((statistics.median(x) for x in steps if x), default=None)
        freed_s = max(0.0, slow.wait_s - statistics.median(o.wait_s for o in others))
        node = next((p.proc.get("node") for p in group if p.rank == worst), None)
        found = Straggler(slow, others, gap, step_s, freed_s, i, len(a.trainings), node,
                          _median([o.wait_s for o in others]), _median([o.fetch_s for o in others]),
                          _median([o.tokenize_s for o in others]))
    return found


def _rank_data(p: ProcessView) -> RankData:
    steps = max(1, len(p.step_times))
    workers = next((ld.get("num_workers") for ld in sorted(p.loaders, key=lambda ld: ld.get("t") or 0.0)), None)
    return RankData(p.rank, len(p.step_times), p.seconds("data_wait") / steps,
                    p.fetch_s / p.fetch_calls if p.fetch_calls else None, p.tokenize_s / steps,
                    workers if isinstance(workers, int) else None)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _word(f: Straggler, claim: Claim) -> Finding:
    r, on = f.slow.rank, f" on {f.node}" if f.node else ""
    ms = _ms
    others_wait, others_fetch, others_tok = f.others_wait_s, f.others_fetch_s, f.others_tokenize_s
    n_others = plural(len(f.others), "other rank")
    said = [f"Rank {r}{on} waited {ms(f.slow.wait_s)} for data each step against {ms(others_wait)} on the "
            f"{n_others}" + (f" (training {f.training + 1} of {f.trainings} in this run)" if f.trainings > 1 else "")]
    if f.slow.fetch_s is not None and others_fetch is not None:
        said.append(f"it took {ms(f.slow.fetch_s)} to build a batch against {ms(others_fetch)} there")
    if f.slow.tokenize_s > 0.002 or (others_tok or 0) > 0.002:
        said.append(f"its tokenizer ran {ms(f.slow.tokenize_s)} a step against {ms(others_tok or 0.0)}")
    if f.step_s:
        said.append(f"every rank steps at its pace ({ms(f.step_s)} a step), waiting for it at each gradient sync")
    cause = CAUSES[f.cause]
    workers = f.slow.workers
    more = f"give it more DataLoader workers (it has {workers})" if workers is not None else \
        "give it more DataLoader workers"
    gain = f.loop_speedup
    summary = (f"Rank {r}{on}: {cause}; {more}. Without its extra {ms(f.freed_s)} a step the job would step "
               + (f"about {gain:.1f}x faster." if gain else "at the other ranks' pace."))
    return Finding(
        rule=StragglerRank.name,
        title=f"Rank {r}{on} holds the other ranks back",
        claims=[claim],
        evidence="; ".join(said) + ".",
        fix=Fix(summary=summary, config={}, snippet=None, library=None),
        data={**({"node": f.node, "rank": r} if f.node else {"rank": r}),
              "wait_per_step_s": round(f.slow.wait_s, 4), "others_wait_per_step_s": round(others_wait or 0.0, 4),
              "batch_build_s": _round(f.slow.fetch_s), "others_batch_build_s": _round(others_fetch),
              "step_s": _round(f.step_s), "freed_per_step_s": round(f.freed_s, 4),
              "loop_speedup": _round(gain)},
    )


def _cause(f: Straggler) -> Cause:
    """What its own figures point at: its tokenizer, its batches cost more to build, or neither (its host)."""
    if f.slow.tokenize_s > 2 * (f.others_tokenize_s or 0.0) and f.slow.tokenize_s >= 0.5 * f.freed_s > 0:
        return "tokenizer"
    if f.slow.fetch_s is not None and f.others_fetch_s is not None and f.slow.fetch_s > 2 * f.others_fetch_s:
        return "build"
    return "host"


CAUSES: dict[Cause, str] = {  # each cause in words
    "tokenizer": "its tokenizer is what is slower: look at its shard's texts (longer?) and its tokenizer settings",
    "build": ("building its batches (its dataset's __getitem__ and collate) takes longer than on the others: "
              "look at what its shard's items cost to read and transform (its disk, its files, a slow step "
              "in its own __getitem__)"),
    "host": ("it waits for batches that cost the others no more to build: look at its host (disk, CPU "
             "shared with other jobs) rather than its data"),
}


def _ms(seconds: float | None) -> str:
    return f"{1000 * seconds:.0f} ms" if seconds is not None else "n/a"


def _round(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def sync_claim(a: Analysis, lead_is_slow: bool, gap: float) -> Claim:
    """What a slow rank (or node) costs the job: the others sit in the gradient sync while it waits
    for data, so their compute carries the gap, or the lead rank's own wait when it is the slow one."""
    bucket: schema.Bucket = "data_wait" if lead_is_slow else "compute"
    held = a.share(bucket)
    return Claim(bucket, 1.0, "loader" if lead_is_slow else "rank_sync",
                 min(1.0, gap / held) if held > 0 else 0.0)


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)


class OutdatedLibraries(Rule):
    name = "outdated_libraries"
    fires_when = 'torch < 2.1, transformers < 4.40, datasets < 2.19, accelerate < 0.30'
    fix_from = 'upgrade, then measure again'

    def match(self, a: Analysis) -> Finding | None:
        p = a.primary
        if p is None:
            return None
        libs = dict(p.proc.get("libs") or {})
        libs.update((p.torch_cfg or {}).get("libs") or {})
        old: dict[str, tuple[str, str]] = {}  # name -> (version that ran, the minimum)
        for name, minimum in MINIMUM.items():
            v = _version(libs.get(name))
            if v is not None and v < minimum:
                old[name] = (libs[name], ".".join(map(str, minimum)))
        return _word_outdated(old) if old else None


def _word_outdated(old: dict[str, tuple[str, str]]) -> Finding:
    return Finding(
        rule=OutdatedLibraries.name,
        severity="low",
        title="Outdated training libraries",
        waste_fraction=0.0,
        evidence="; ".join(f"{n} {v} (< {m})" for n, (v, m) in old.items()) + ". Gains are not measured here.",
        fix=Fix(
            summary="Upgrade, then re-run gpudoctor to measure the difference.",
            config={n: f">={m}" for n, (_, m) in old.items()},
            snippet="pip install -U " + " ".join(old),
            library="pip",
        ),
        predicted_speedup=None,
        data={n: v for n, (v, _) in old.items()},
    )
