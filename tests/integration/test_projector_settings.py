"""The projector's batch wait: milliseconds from the environment, refused when out of range."""

from __future__ import annotations

import pytest

from services.projector.app import BATCH_WITHIN_ENV, BATCH_WITHIN_S, batch_within_s


def test_the_default_and_an_override() -> None:
    assert batch_within_s({}) == BATCH_WITHIN_S
    assert batch_within_s({BATCH_WITHIN_ENV: ""}) == BATCH_WITHIN_S
    assert batch_within_s({BATCH_WITHIN_ENV: "50"}) == 0.05
    assert batch_within_s({BATCH_WITHIN_ENV: "0"}) == 0.0


@pytest.mark.parametrize(("raw", "why"), [
    ("0.05", "whole milliseconds"), ("ten", "whole milliseconds"), ("-1", "between 0 and 5000"),
    ("5001", "between 0 and 5000")])
def test_bad_values_say_what_is_wrong(raw: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as e:
        batch_within_s({BATCH_WITHIN_ENV: raw})
    assert BATCH_WITHIN_ENV in str(e.value)
