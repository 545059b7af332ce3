"""One definition of a finding: the report schema's TypedDicts. The rules' dataclasses carry the
same fields (plus what only settles a figure) and write every schema key, so a field added on
one side and forgotten on the other fails here, not in a user's report."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gpudoctor.core import schema
from gpudoctor.report.check import problem
from gpudoctor.rules import account, base
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Table


def _keys(typed_dict: Any) -> set[str]:
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def _fields(cls: Any) -> set[str]:
    return {f.name for f in fields(cls)}


def test_the_dataclasses_have_the_schemas_fields() -> None:
    assert _fields(Table) == _keys(schema.FixTable)
    assert _fields(Fix) == _keys(schema.Fix)
    assert _fields(Claim) - account.SETTLED_ONLY == _keys(schema.Claim)
    assert _fields(Finding) - base.SETTLED_ONLY == _keys(schema.Finding) - base.REPORT_ONLY
    assert _fields(Finding) >= base.SETTLED_ONLY and not base.REPORT_ONLY & _fields(Finding)


def _full_finding() -> Finding:
    """A finding with every field set: a settled claim with an optimistic end, a priced launch."""
    fix = Fix(summary="Save less often.", config={"save_steps": 500}, snippet="x", library="transformers",
              call="TrainingArguments", also=[Table("datasets.Dataset.map", "ds.map", {"num_proc": 4})],
              memory={"predicted_peak_mib": 42_000.0, "headroom_mib": 30_903.4, "limit_mib": 72_903.4,
                      "basis": "measured"})
    f = Finding("checkpoint_overhead", "Checkpoints are saved too often", "10 saves.", fix,
                claims=[Claim("checkpoint", 0.5, "after_save", 0.4, up_to=0.8)], data={"saves": 10},
                per_launch_s=36.0)
    base.settle_findings({"checkpoint": 0.3}, [f])
    return f


def test_to_dict_writes_every_schema_key() -> None:
    written = _full_finding().to_dict(usd_per_hour=2.0)
    assert set(written) == _keys(schema.Finding)
    assert set(written["fix"]) == _keys(schema.Fix)
    assert set(written["fix"]["also"][0]) == _keys(schema.FixTable)
    assert set(written["claims"][0]) == _keys(schema.Claim)
    assert written["predicted_speedup_range"] is not None and written["data"]["usd_per_launch"] == 0.02


def test_a_written_finding_validates_in_a_report() -> None:
    report: dict[str, Any] = {"schema": schema.SCHEMA, "run": {"duration_s": 10.0}, "breakdown": {},
                              "findings": [_full_finding().to_dict(usd_per_hour=2.0)],
                              "cost": {"wasted_fraction": 0.1}, "verdict": "x"}
    assert problem(report) is None
