"""One replay report, one value per knob: the finding and the preflight agree on max_length.

Issue 10 saw seed 002's replay propose max_length 1344 in the padding finding (p99 of the
rows the replay trained on) and 1472 in the preflight (p99 of the length sample). The
preflight now sizes the fix from the recording's lengths with the rules' own functions.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import ROOT, run_cli

SEED002 = ROOT / "sample_configs" / "seed002_padding_2048.yaml"


def _values_of(node: Any, key: str) -> list[Any]:
    """Every value stored under ``key`` anywhere in a finding's fix (config or tables)."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == key] + [
            x for v in node.values() for x in _values_of(v, key)
        ]
    if isinstance(node, list):
        return [x for v in node for x in _values_of(v, key)]
    return []


def test_seed002_replay_shows_one_max_length(tmp_path) -> None:
    text = SEED002.read_text().replace("examples: 1000", "examples: 400")
    config = tmp_path / "seed002_small.yaml"
    config.write_text(text)
    out = tmp_path / "run"
    proc = run_cli("replay", str(config), "--out", str(out), "--max-steps", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    finding = next(f for f in report["findings"] if f["rule"] == "padding_waste")
    fix = next(f for f in report["preflight"]["fixes"] if f["rule"] == "padding_waste")
    seen = set(_values_of(finding["fix"], "max_length")) | {fix["config"]["max_length"]}
    seen |= {report["preflight"]["after"]["max_length"]}
    assert len(seen) == 1, seen
    multiples = set(_values_of(finding["fix"], "pad_to_multiple_of"))
    assert multiples <= {fix["config"]["pad_to_multiple_of"]}
