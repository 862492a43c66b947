from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.status import batch_state, duration_ms, format_time_ms, group_state, humanize_ms


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"), (999, "999ms"), (1_000, "1s"), (1_500, "1s 500ms"), (61_000, "1 minute 1s"),
    (120_000, "2 minutes"), (3_600_000 + 60_000, "1 hour 1 minute"), (90_000_000, "1 day 1 hour"),
], ids=str)
def test_humanize(ms: int, text: str) -> None:
    assert humanize_ms(ms) == text


def test_format_time() -> None:
    assert format_time_ms(1_767_225_600_123) == "2026-01-01T00:00:00.123Z"
    assert format_time_ms(None) is None


@given(st.integers(0, 10**12))
def test_humanize_is_two_units_at_most(ms: int) -> None:
    text = humanize_ms(ms)
    assert text is not None and 1 <= len(text.replace(" minutes", "m").split()) <= 4


@pytest.mark.parametrize(("committed", "failed", "cancelled", "complete", "state"), [
    (False, 1, True, True, "open"), (True, 1, True, False, "failure"),
    (True, 0, True, True, "cancelled"), (True, 0, False, True, "success"),
    (True, 0, False, False, "running"),
], ids=str)
def test_batch_state_order(committed: bool, failed: int, cancelled: bool, complete: bool,
                           state: str) -> None:
    assert batch_state(committed=committed, n_failed=failed, cancelled=cancelled,
                       complete=complete) == state
    if committed:
        assert group_state(n_failed=failed, cancelled=cancelled, complete=complete) == state


def test_duration() -> None:
    assert duration_ms(None, None, 5) is None
    assert duration_ms(1, None, 5) == 4
    assert duration_ms(1, 3, 5) == 2
