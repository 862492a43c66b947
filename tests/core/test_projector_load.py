"""How the projector's handler splits the job ids it loads into key ranges (one query each)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from services.projector.handlers import _runs


@given(st.sets(st.integers(0, 2_000)))
def test_runs_cover_exactly_the_ids_with_a_gap_between_each(ids: set[int]) -> None:
    runs = _runs(sorted(ids))
    assert {j for lo, hi in runs for j in range(lo, hi + 1)} == ids
    assert all(lo <= hi for lo, hi in runs)
    assert all(a[1] + 1 < b[0] for a, b in pairwise(runs))


def test_a_window_with_loaded_ids_missing_is_read_around_them() -> None:
    assert _runs([0, 1, 2, 5, 6, 9]) == [(0, 2), (5, 6), (9, 9)]
    assert _runs([]) == []
