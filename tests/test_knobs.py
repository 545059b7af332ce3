"""The knob registry (issue #40 item 1): every key a fix sets belongs to one knob, the scripts' option
names come from it, and ``try`` predicts through it what the finding printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudoctor.rules import knobs, script_flags

GOLDEN = Path(__file__).parent / "data" / "golden"


def _fix_keys(report: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for f in report.get("findings", []):
        fix = f.get("fix") or {}
        for table in [fix, *(fix.get("also") or [])]:
            if table.get("library") != script_flags.LIBRARY:  # the script's own flags, by their names
                keys |= set(table.get("config") or {})
        alternative = (f.get("data") or {}).get("alternative")
        keys |= set(alternative or {})
    return keys


def test_every_key_a_golden_report_sets_is_a_registered_knob() -> None:
    keys = set().union(*(_fix_keys(json.loads(p.read_text())) for p in GOLDEN.glob("*.json")))
    assert keys, "the goldens carry fixes"
    assert {k for k in keys if knobs.knob_for(k) is None} == set()


def test_a_key_belongs_to_one_knob_and_only_a_value_has_aliases() -> None:
    seen: dict[str, str] = {}
    for k in knobs.KNOBS:
        for key in k.keys:
            assert seen.setdefault(key, k.name) == k.name, f"{key} in {seen[key]} and {k.name}"
        assert set(k.applied) <= {knobs.HOOKS, knobs.FLAGS, knobs.CODE} and k.rules and k.spelled
    assert knobs.aliases("num_workers") == knobs.aliases("dataloader_num_workers")
    assert "workers" in (knobs.aliases("num_workers") or set())
    assert knobs.aliases("persistent_workers") is None  # set beside the workers, not another name of them
    assert knobs.knob_for("persistent_workers") is knobs.knob_for("num_workers")
    assert "save_steps" in knobs.APPROXIMATE and "eval_iters" in knobs.PROPORTIONAL


def test_every_rule_a_knob_names_exists() -> None:
    from gpudoctor.rules.catalog import RULES

    names = {r.name for r in RULES}
    assert {rule for k in knobs.KNOBS for rule in k.rules} <= names
