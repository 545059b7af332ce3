"""The events file's format is declared once, as types (gpudoctor/core/events.py): the loader's
checks follow them, so a line the types call malformed is dropped and one they allow is kept."""

from __future__ import annotations

from gpudoctor.core import events
from gpudoctor.recording.validate import EVENT_FIELDS, clean_event

T = 1_700_000_000.0


def test_every_checked_kind_has_its_type_and_the_required_keys_of_that_type():
    assert set(EVENT_FIELDS) == set(events.CHECKED)
    for kind, cls in events.CHECKED.items():
        required, _ = EVENT_FIELDS[kind]
        assert set(required) == set(cls.__required_keys__) - {"k"}, kind


def test_a_line_is_kept_or_dropped_as_its_type_says():
    span: events.SpanEvent = {"k": "span", "c": "data_wait", "t0": T, "dt": 0.5}
    assert clean_event(dict(span)) is not None
    assert clean_event({**span, "dt": -0.5}) is None  # Seconds: never negative
    assert clean_event({k: v for k, v in span.items() if k != "t0"}) is None  # required
    step: events.StepEvent = {"k": "step", "t": T, "n": 3, "dt": None}
    assert clean_event(dict(step)) is not None  # dt: Seconds | None
    assert clean_event({**step, "n": -1}) is None  # Count: not negative
    proc: events.ProcEvent = {"k": "proc"}
    assert clean_event(dict(proc)) is not None  # every field optional (older writers)
    assert clean_event({"k": "proc", "argv": ["python", 3]}) is None  # list[str]
    plan: events.PlanEvent = {"k": "plan", "t": T, "max_steps": 10, "global_step": "not checked"}
    assert clean_event(dict(plan)) is not None  # Unchecked: written, never refused
    assert clean_event({"k": "cli", "t": T, "options": [{"flags": ["--x"]}]}) is None  # an option has a dest
