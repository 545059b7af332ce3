"""Multi-process rules: one rank holding the others back; outdated libraries."""

from __future__ import annotations

import statistics

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.nodes import slow_node
from gpudoctor.common.wording import plural
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct

# Versions before these miss loader and attention speedups users report (see seeds/002).
MINIMUM = {"torch": (2, 1), "transformers": (4, 40), "datasets": (2, 19), "accelerate": (0, 30)}


class StragglerRank(Rule):
    name = "straggler_rank"
    fires_when = ("one rank's data wait ≥ 10 points above the median of the other ranks of its training "
                  "(every node's ranks, when `gpudoctor report` merges a job's node folders)")
    fix_from = "per-rank evidence: that rank's data path (shard, host, disk), its workers; its node named"

    def match(self, a: Analysis) -> Finding | None:
        # Only ranks of one job compare: processes that ran together (a training), each rank
        # once. Trainings run one after another, or side by side without distinct ranks, are
        # not ranks holding each other back.
        found = None
        for i, group in enumerate(a.trainings):
            if len(group) < 2 or len({p.rank for p in group}) < len(group):
                continue
            waits = {p.rank: p.breakdown["data_wait"] for p in group}
            worst = max(waits, key=lambda r: waits[r])
            median = statistics.median(w for r, w in waits.items() if r != worst)
            gap = (waits[worst] - median) * group[0].wall_s / a.duration_s  # as a share of the run
            if gap >= 0.10 and (found is None or gap > found[0]):
                found = (gap, i, group, waits, worst, median)
        if found is None:
            return None
        gap, i, group, waits, worst, median = found
        node = next((p.proc.get("node") for p in group if p.rank == worst), None)
        whole = slow_node(a)
        if node and whole is not None and whole[0] == node:
            return None  # every rank of that node is slow: straggler_node names the host instead
        on = f" on {node}" if node else ""
        which = f" (training {i + 1} of {len(a.trainings)} in this run)" if len(a.trainings) > 1 else ""
        return Finding(
            rule=self.name,
            title=f"Rank {worst}{on} holds the other ranks back",
            claims=[sync_claim(a, group[0].rank == worst, gap)],
            evidence=(
                f"Rank {worst}{on} waited for data {pct(waits[worst])} of wall time{which} against a median of "
                f"{pct(median)} on the other {plural(len(waits) - 1, 'rank')}; in data-parallel "
                "training every rank waits for the slowest at each gradient sync."
            ),
            fix=Fix(
                summary=f"Find what is slow on rank {worst}'s data path{on} (its shard, host, disk); give it "
                "more DataLoader workers or balance shards with DistributedSampler.",
                config={},
                snippet=None,
                library=None,
            ),
            data={**({"node": node, "rank": worst} if node else {}),
                  **{f"rank{r}_data_wait": round(w, 4) for r, w in sorted(waits.items())}},
        )


def sync_claim(a: Analysis, lead_is_slow: bool, gap: float) -> Claim:
    """What a slow rank (or node) costs the job: the others sit in the gradient sync while it waits
    for data, so their compute carries the gap, or the lead rank's own wait when it is the slow one."""
    bucket = "data_wait" if lead_is_slow else "compute"
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
