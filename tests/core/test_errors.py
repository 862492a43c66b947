"""How error messages list values: every value up to ten, else ten and how many in all."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.errors import LISTED, counted, listed, reserved


@given(st.lists(st.integers(), max_size=LISTED))
def test_a_few_values_are_all_listed_and_not_counted(values: list[int]) -> None:
    assert listed(values) == str(values)
    assert counted(values) == ""


@given(st.lists(st.integers(), min_size=LISTED + 1, max_size=2_000))
def test_many_values_list_the_first_ten_and_count_them_all(values: list[int]) -> None:
    text = listed(values)
    assert text == str(values[:LISTED])[:-1] + ", ...]"
    assert counted(values) == f" ({len(values)} in all)"
    assert len(text) < 250  # one line, however many values


def test_what_an_update_reserved() -> None:
    assert reserved("job", 0) == "the update reserved no jobs"
    assert reserved("job", 1) == "the update reserved 1 job (id 1)"
    assert reserved("job group", 7) == "the update reserved 7 job groups (ids 1 to 7)"
