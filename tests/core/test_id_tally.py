from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given
from hypothesis import strategies as st

from core.id_tally import IdTally


def test_consecutive_bunches_make_one_run() -> None:
    t = IdTally(101, 3000)
    for lo in range(101, 3101, 1000):
        t.add(range(lo, lo + 1000))
    assert t.complete
    assert t.runs == [(101, 3101)]


def test_resent_ids_count_once() -> None:
    t = IdTally(1, 10)
    t.add(range(1, 6))
    t.add(range(3, 8))
    t.add([1, 2])
    assert t.count == 7
    assert not t.complete
    t.add([10, 9, 8])
    assert t.complete


def test_ids_outside_the_range_do_not_count() -> None:
    t = IdTally(5, 5)
    t.add([1, 4, 10, 11, 5, 9])
    assert t.count == 2
    assert t.runs == [(5, 6), (9, 10)]


def test_a_run_bridging_two_runs_merges_them() -> None:
    t = IdTally(0, 100)
    t.add_run(0, 10)
    t.add_run(20, 30)
    t.add_run(40, 50)
    t.add_run(10, 20)
    assert t.runs == [(0, 30), (40, 50)]
    assert t.count == 40


@given(st.integers(-5, 5), st.integers(0, 60),
       st.lists(st.lists(st.integers(-10, 80), max_size=30), max_size=12))
def test_count_and_runs_match_a_set(lo: int, n: int, bunches: list[list[int]]) -> None:
    t = IdTally(lo, n)
    seen: set[int] = set()
    for ids in bunches:
        t.add(ids)
        seen |= {i for i in ids if lo <= i < lo + n}
        assert t.count == len(seen)
        assert t.complete == (len(seen) == n)
        runs = t.runs
        assert {i for s, e in runs for i in range(s, e)} == seen
        # Disjoint, sorted and never touching: the fewest runs that cover the set.
        assert all(e1 < s2 for (_, e1), (s2, _) in pairwise(runs))
        for i in range(lo - 2, lo + n + 2):
            assert (i in t) == (i in seen)


@example(ids=[23, 24, 25], lo=25, hi=24)  # an empty range across a run: was -1 (CI found it)
@given(st.lists(st.integers(0, 40), max_size=40), st.integers(-3, 45), st.integers(-3, 45))
def test_seen_within_counts_the_seen_ids_of_a_range(ids: list[int], lo: int, hi: int) -> None:
    t = IdTally(0, 40)
    t.add(ids)
    assert t.seen_within(lo, hi) == len({i for i in ids if lo <= i < hi and 0 <= i < 40})
