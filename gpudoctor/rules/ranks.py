"""Multi-process rules: one rank holding the others back; outdated libraries."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.nodes import slow_node
from gpudoctor.analysis.process import ProcessView
from gpudoctor.common.wording import plural
from gpudoctor.core import schema
from gpudoctor.core.thresholds import RANK_GAP, points
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule

# Versions before these miss loader and attention speedups users report (see seeds/002).
MINIMUM = {"torch": (2, 1), "transformers": (4, 40), "datasets": (2, 19), "accelerate": (0, 30)}
Cause = Literal["tokenizer", "build", "host"]  # what a straggler's own figures point at
Part = Literal["data_wait", "compute"]  # what makes it slow


@dataclass
class RankData:
    """One rank's own data-path measurements, per training step."""

    rank: int
    steps: int
    wait_s: float  # data wait per step
    fetch_s: float | None  # batch production per batch (dataset + collate, here or in its workers)
    tokenize_s: float  # tokenizer seconds per step
    workers: int | None
    compute_s: float = 0.0  # compute per step (forward, backward, optimizer: the all-reduce wait left out)
    comm_s: float = 0.0  # communication per step: collectives it waited for (exposed)


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
    part: Part = "data_wait"  # what makes it slow: its data wait, or its compute
    others_wait_s: float | None = None  # medians over the other ranks: data wait per step,
    others_fetch_s: float | None = None  # batch build per batch,
    others_tokenize_s: float | None = None  # tokenizer seconds per step,
    others_compute_s: float | None = None  # compute per step,
    others_comm_s: float | None = None  # communication per step

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
    fires_when = (f"one rank's data wait (or its compute, where the all-reduce is timed apart) ≥ {points(RANK_GAP)} above "
                  "the median of the other ranks of its training "
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
        return _word(found, sync_claims(a, lead_is_slow, found.gap, found.part))


def _straggler(a: Analysis) -> Straggler | None:
    # Only ranks of one job compare: processes that ran together (a training), each rank
    # once. Trainings run one after another, or side by side without distinct ranks, are
    # not ranks holding each other back.
    found: Straggler | None = None
    for i, group in enumerate(a.trainings):
        if len(group) < 2 or len({p.rank for p in group}) < len(group):
            continue
        # Its data wait, or its compute where the others' wait for it is measured apart from theirs
        # (communication): with no collective timed, a fast rank's wait in the all-reduce is compute.
        parts: tuple[Part, ...] = (("data_wait", "compute") if any(p.breakdown["communication"] > 0 for p in group)
                                   else ("data_wait",))
        for part in parts:
            shares = {p.rank: p.breakdown[part] for p in group}
            worst = max(shares, key=lambda r: shares[r])
            median = statistics.median(w for r, w in shares.items() if r != worst)
            gap = (shares[worst] - median) * group[0].wall_s / a.duration_s  # as a share of the run
            if gap < RANK_GAP or (found is not None and gap <= found.gap):
                continue
            data = {p.rank: _rank_data(p) for p in group}
            slow, others = data[worst], [d for r, d in sorted(data.items()) if r != worst]
            steps = [p.step_intervals_s() for p in group if len(p.step_times) > 2]
            # Every rank steps at the pace of the slowest (the gradient sync): the job's step time.
            step_s = max((statistics.median(x) for x in steps if x), default=None)
            freed_s = max(0.0, _own(slow, part) - statistics.median(_own(o, part) for o in others))
            node = next((p.node for p in group if p.rank == worst), None)
            found = Straggler(slow, others, gap, step_s, freed_s, i, len(a.trainings), node, part,
                              _median([o.wait_s for o in others]), _median([o.fetch_s for o in others]),
                              _median([o.tokenize_s for o in others]), _median([o.compute_s for o in others]),
                              _median([o.comm_s for o in others]))
    return found


def _own(d: RankData, part: str) -> float:
    """A rank's own seconds per step of ``part`` (its data wait or its compute)."""
    return d.wait_s if part == "data_wait" else d.compute_s


def _rank_data(p: ProcessView) -> RankData:
    steps = max(1, len(p.step_times))
    workers = next((ld.get("num_workers") for ld in sorted(p.loaders, key=lambda ld: ld.get("t") or 0.0)), None)
    return RankData(p.rank, len(p.step_times), p.seconds("data_wait") / steps,
                    p.fetch_s / p.fetch_calls if p.fetch_calls else None, p.tokenize_s / steps,
                    workers if isinstance(workers, int) else None, p.seconds("compute") / steps,
                    p.seconds("communication") / steps)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _word(f: Straggler, claims: list[Claim]) -> Finding:
    r, on = f.slow.rank, f" on {f.node}" if f.node else ""
    ms = _ms
    others_wait, others_fetch, others_tok = f.others_wait_s, f.others_fetch_s, f.others_tokenize_s
    others_compute, others_comm = f.others_compute_s, f.others_comm_s
    n_others = plural(len(f.others), "other rank")
    which = f" (training {f.training + 1} of {f.trainings} in this run)" if f.trainings > 1 else ""
    if f.part == "compute":
        said = [f"Rank {r}{on} computed {ms(f.slow.compute_s)} each step against {ms(others_compute)} on the "
                f"{n_others}{which}"]
    else:
        said = [f"Rank {r}{on} waited {ms(f.slow.wait_s)} for data each step against {ms(others_wait)} on the "
                f"{n_others}{which}"]
    if f.slow.fetch_s is not None and others_fetch is not None and f.part == "data_wait":
        # the figures batch_build_s says, rounded once (81.496 ms said 81 beside a data field of 82)
        said.append(f"it took {ms(round(f.slow.fetch_s, 4))} to build a batch against {ms(round(others_fetch, 4))} there")
    if f.slow.tokenize_s > 0.002 or (others_tok or 0) > 0.002:
        said.append(f"its tokenizer ran {ms(f.slow.tokenize_s)} a step against {ms(others_tok or 0.0)}")
    if (others_comm or 0.0) > 0 or f.slow.comm_s > 0:
        said.append(f"the others waited {ms(others_comm)} a step in the gradient all-reduce (communication) "
                    f"against {ms(f.slow.comm_s)} on it")
    if f.step_s:
        said.append(f"every rank steps at its pace ({ms(f.step_s)} a step), waiting for it at each gradient sync")
    gain = f.loop_speedup
    if f.part == "compute":
        fix = SLOW_COMPUTE
    else:
        workers = f.slow.workers
        more = f"give it more DataLoader workers (it has {workers})" if workers is not None else \
            "give it more DataLoader workers"
        fix = f"{CAUSES[f.cause]}; {more}"
    summary = (f"Rank {r}{on}: {fix}. Without its extra {ms(f.freed_s)} a step the job would step "
               + (f"about {gain:.1f}x faster." if gain else "at the other ranks' pace."))
    return Finding(
        rule=StragglerRank.name,
        title=f"Rank {r}{on} holds the other ranks back",
        claims=claims,
        evidence="; ".join(said) + ".",
        fix=Fix(summary=summary, config={}, snippet=None, library=None),
        data={**({"node": f.node, "rank": r} if f.node else {"rank": r}), "slow_part": f.part,
              "wait_per_step_s": round(f.slow.wait_s, 4), "others_wait_per_step_s": round(others_wait or 0.0, 4),
              "compute_per_step_s": round(f.slow.compute_s, 4),
              "others_compute_per_step_s": round(others_compute or 0.0, 4),
              "communication_per_step_s": round(f.slow.comm_s, 4),
              "others_communication_per_step_s": round(others_comm or 0.0, 4),
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
SLOW_COMPUTE = ("its own compute is what is slower, not its data: look at its device (another process on its "
                "GPU or cores, clocks throttled) and at what its shard feeds it (longer sequences?)")


def _ms(seconds: float | None) -> str:
    return f"{1000 * seconds:.0f} ms" if seconds is not None else "n/a"


def _round(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def sync_claims(a: Analysis, lead_is_slow: bool, gap: float, part: str = "data_wait") -> list[Claim]:
    """What a slow rank (or node) costs the job: the lead rank's own extra ``part`` (its data wait or
    its compute) when it is the slow one; else the lead's wait for it at the gradient sync, which is
    communication where the collectives were timed and compute where they were not."""
    if lead_is_slow:
        bucket: schema.Bucket = "compute" if part == "compute" else "data_wait"
        held = a.share(bucket)
        return [Claim(bucket, 1.0, "loader" if bucket == "data_wait" else "rank_compute",
                      min(1.0, gap / held) if held > 0 else 0.0)]
    claims = []
    comm, compute = a.share("communication"), a.share("compute")
    in_comm = min(gap, comm)
    if in_comm > 0:
        claims.append(Claim("communication", 1.0, "rank_sync", in_comm / comm))
    if gap - in_comm > 1e-4 or not claims:
        claims.append(Claim("compute", 1.0, "rank_sync", min(1.0, (gap - in_comm) / compute) if compute > 0 else 0.0))
    return claims


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
        libs.update((p.torch_cfg.get("libs") if p.torch_cfg is not None else None) or {})
        old = {}
        for name, minimum in MINIMUM.items():
            v = _version(libs.get(name))
            if v is not None and v < minimum:
                old[name] = (libs[name], ".".join(map(str, minimum)))
        if not old:
            return None
        return Finding(
            rule=self.name,
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
