"""A whole node holding a multi-node job back (seen once `gpudoctor report` merges its node folders).

When every rank of one node waits for data longer than the ranks elsewhere, the cause is that
node's host (its disk, its CPU per rank, its mount of the data), not one rank's shard: the fix is
on the machine, and ``straggler_rank`` leaves the finding to this rule.
"""

from __future__ import annotations

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.nodes import slow_node
from gpudoctor.rules.base import Finding, Fix, Rule, pct
from gpudoctor.rules.ranks import sync_claims


class StragglerNode(Rule):
    name = "straggler_node"
    fires_when = ("a merged multi-node job: every rank of one node waits for data ≥ 10 points above the median "
                  "rank of the other nodes")
    fix_from = "that node's host: its data storage and mount, its CPU per rank, its DataLoader workers"

    def match(self, a: Analysis) -> Finding | None:
        found = slow_node(a)
        if found is None:
            return None
        node, fastest, median, gap = found
        ranks = sorted(p.rank for p in a.procs if p.proc.get("node") == node)
        return Finding(
            rule=self.name,
            title=f"{node} holds the other nodes back",
            # the lead rank's own wait when the lead rank is on this node
            claims=sync_claims(a, bool(a.procs) and a.procs[0].proc.get("node") == node, gap),
            evidence=(
                f"Every rank of {node} (ranks {', '.join(map(str, ranks))}) waited for data at least "
                f"{pct(fastest)} of its wall time, against a median of {pct(median)} on the other nodes' ranks; "
                "in data-parallel training every rank waits for the slowest at each gradient sync."
            ),
            fix=Fix(
                summary=f"Compare {node}'s host with the others: where its data is read from (a slower mount "
                "or disk), its CPU per rank and load, its DataLoader workers; stage the data locally there.",
            ),
            data={"node": node, "ranks": ranks, "fastest_rank_data_wait": round(fastest, 4),
                  "others_median_data_wait": round(median, 4)},
        )
