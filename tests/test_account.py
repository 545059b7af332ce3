"""One account of time: claims on the breakdown settle per bucket, never as a plain sum."""

from __future__ import annotations

import inspect

import pytest

from gpudoctor.report import build as report
from gpudoctor.rules import all_rules
from gpudoctor.rules.account import Claim, claim, removed_of_bucket, speedup, wasted_share

SHARES = {"startup": 0.1, "data_wait": 0.4, "compute": 0.5, "checkpoint": 0.0, "eval": 0.0, "other": 0.0}


def test_claims_on_one_part_compound_and_disjoint_parts_add():
    tf32, bf16 = Claim("compute", 0.5, "gpu_busy", 0.6), Claim("compute", 0.5, "gpu_busy", 0.6)
    assert removed_of_bucket([tf32, bf16]) == pytest.approx(0.6 * 0.75)  # not 0.6 * 1.0
    tok = claim("data_wait", 30.0, 40.0, part="tokenize", part_s=30.0)
    rest = claim("data_wait", 10.0, 40.0, part="loader", part_s=10.0)
    assert removed_of_bucket([tok, rest]) == pytest.approx(1.0)  # disjoint seconds: all of the wait


def test_a_whole_bucket_claim_compounds_with_what_the_parts_left():
    idle = Claim("compute", 1.0, "gpu_idle", 0.5)
    padding = Claim("compute", 0.4)
    assert removed_of_bucket([idle, padding]) == pytest.approx(0.5 + 0.5 * 0.4)


def test_the_total_never_exceeds_the_buckets_claimed():
    claims = [Claim("data_wait", 0.9, "loader", 1.0)] * 5 + [Claim("startup", 2.0)]
    total = wasted_share(SHARES, claims)
    assert total <= SHARES["data_wait"] + SHARES["startup"]
    assert total == pytest.approx(0.4 * (1 - 0.1 ** 5) + 0.1)
    assert speedup(0.0) is None and speedup(0.5) == pytest.approx(2.0)


def test_report_has_no_special_case_for_a_rule_name():
    source = inspect.getsource(report)
    names = {type(r).name for r in all_rules()} | {"small_batch"}
    assert not [n for n in names if f'"{n}"' in source or f"'{n}'" in source]
