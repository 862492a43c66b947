"""The property tests' profile (tests/conftest.py): no timing in a unit test."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_the_profile_sets_no_deadline_and_allows_slow_data() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


@settings(max_examples=3)  # a test's own settings keep the profile's other values
@given(st.integers())
def test_an_example_slower_than_hypothesis_default_deadline_passes(n: int) -> None:
    time.sleep(0.25)  # beyond the default 200 ms: a slow hour, not a failure
    assert isinstance(n, int)
