"""The one fix engine: each knob's value from the observation, within what was observed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpudoctor.rules import values


def test_rows_all_32_tokens_long_get_no_max_length_and_a_multiple_that_fits():
    # Before: max_length=64 and pad_to_multiple_of=64 for rows of 32 tokens (longer than any row).
    assert values.max_length_for(32, 32) is None
    assert values.pad_multiple_for(32) == 8


@given(lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=200),
       configured=st.none() | st.integers(1, 8192))
def test_max_length_is_at_least_p99_and_never_above_what_is_padded_or_configured(lengths, configured):
    p99 = values.percentile(lengths, 99)
    longest = max(lengths)
    multiple = values.pad_multiple_for(values.percentile(lengths, 50))
    new = values.max_length_for(p99, longest, configured, multiple)
    if new is not None:
        assert p99 <= new < min(x for x in (longest, configured) if x)


def test_save_steps_and_workers_are_round_and_fit_the_machine():
    # 6 s per save, 80 ms steps: 6 * 0.98 / (0.02 * 0.08) = 3675 -> 5000.
    assert values.save_steps_for(6.0, 0.08) == 5000
    assert values.nice_round_up(1873) == 2000 and values.nice_round_up(0.3) == 1
    assert values.workers_needed(0.28, 0.05) == 7
    assert values.workers_for(7, free_cores=1) == 1 and values.workers_for(7, free_cores=0) == 0
