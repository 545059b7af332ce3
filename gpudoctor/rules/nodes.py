"""A whole node holding a multi-node job back (seen once `gpudoctor report` merges its node folders).

When every rank of one node waits for data longer than the ranks elsewhere, the cause is that
node's host (its disk, its CPU per rank, its mount of the data), not one rank's shard: the fix is
on the machine, and ``straggler_rank`` leaves the finding to this rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.nodes import slow_node
from gpudoctor.core.thresholds import RANK_GAP, points
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.ranks import sync_claims


@dataclass(frozen=True)
class NodeFigures:
    """The slow node, its ranks and their data wait beside the other nodes': worded by ``_word``."""

    node: str
    ranks: list[int]
    fastest: float  # the least data wait of its ranks, as a share of wall time
    median: float  # the other nodes' median rank's


class StragglerNode(Rule):
    name = "straggler_node"
    fires_when = (f"a merged multi-node job: every rank of one node waits for data ≥ {points(RANK_GAP)} above the median "
                  "rank of the other nodes")
    fix_from = "that node's host: its data storage and mount, its CPU per rank, its DataLoader workers"

    def match(self, a: Analysis) -> Finding | None:
        found = slow_node(a)
        if found is None:
            return None
        node, fastest, median, gap = found
        ranks = sorted(p.rank for p in a.procs if p.node == node)
        # the lead rank's own wait when the lead rank is on this node
        held = sync_claims(a, bool(a.procs) and a.procs[0].node == node, gap)
        return _word(NodeFigures(node, ranks, fastest, median), held)


def _word(fig: NodeFigures, held: list[Claim]) -> Finding:
    node = fig.node
    return Finding(
        rule=StragglerNode.name,
        title=f"{node} holds the other nodes back",
        claims=held,
        evidence=(
            f"Every rank of {node} (ranks {', '.join(map(str, fig.ranks))}) waited for data at least "
            f"{pct(fig.fastest)} of its wall time, against a median of {pct(fig.median)} on the other nodes' ranks; "
            "in data-parallel training every rank waits for the slowest at each gradient sync."
        ),
        fix=Fix(
            summary=f"Compare {node}'s host with the others: where its data is read from (a slower mount "
            "or disk), its CPU per rank and load, its DataLoader workers; stage the data locally there.",
        ),
        data={"node": node, "ranks": fig.ranks, "fastest_rank_data_wait": round(fig.fastest, 4),
              "others_median_data_wait": round(fig.median, 4)},
    )
