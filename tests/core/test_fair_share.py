from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from core.fair_share import (
    UserDemand,
    WindowEntry,
    autoscaler_shares,
    estimated_job_queue,
    fair_share,
    window_cores_by_regions,
    window_cores_by_user,
)

U = UserDemand

demand = st.builds(UserDemand, st.integers(0, 50_000), st.integers(0, 50_000))
demands = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), demand, max_size=8)
free = st.integers(-1_000, 200_000)


@pytest.mark.parametrize(("free_mcpu", "given_demands", "expected"), [
    (0, {"a": U(1000)}, {"a": 0}),
    (-5, {"a": U(1000)}, {"a": 0}),
    (5000, {}, {}),
    (5000, {"a": U(0, 7000)}, {"a": 0}),
    # Enough for everyone: everyone gets all their ready cores.
    (5000, {"a": U(1000), "b": U(2000, 9000)}, {"a": 1000, "b": 2000}),
    # Equal running: equal split.
    (4000, {"a": U(10_000), "b": U(10_000)}, {"a": 2000, "b": 2000}),
    # The seed's walk: a (0 running) fills to b's 2000, then a and b share until c's 5000 ...
    (7000, {"a": U(10_000, 0), "b": U(10_000, 2000), "c": U(10_000, 5000)},
     {"a": 4500, "b": 2500, "c": 0}),
    # ... and with more, all three rise together from 5000 (a=5000, b=3000 leaves 2000 = 3*666+2).
    (10_000, {"a": U(10_000, 0), "b": U(10_000, 2000), "c": U(10_000, 5000)},
     {"a": 5667, "b": 3667, "c": 666}),
    # A capped user's unused share flows on to the others.
    (6000, {"a": U(1000), "b": U(10_000), "c": U(10_000)}, {"a": 1000, "b": 2500, "c": 2500}),
    # A user already far ahead gets nothing while others are below them.
    (3000, {"a": U(10_000, 0), "b": U(10_000, 8000)}, {"a": 3000, "b": 0}),
    # Gap between users: a is capped below b's running cores; b takes the rest.
    (150, {"a": U(100, 0), "b": U(100, 500)}, {"a": 100, "b": 50}),
    # Remainder: 1000 over 3 equal users, the extra mCPU goes by name.
    (1000, {"c": U(5000), "b": U(5000), "a": U(5000)}, {"a": 334, "b": 333, "c": 333}),
], ids=lambda v: repr(v)[:40])
def test_examples(free_mcpu: int, given_demands: dict[str, UserDemand],
                  expected: dict[str, int]) -> None:
    assert fair_share(free_mcpu, given_demands) == expected


def test_negative_demand_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        fair_share(1000, {"a": U(-1)})


@given(free, demands)
def test_bounds(free_mcpu: int, ds: dict[str, UserDemand]) -> None:
    alloc = fair_share(free_mcpu, ds)
    assert alloc.keys() == ds.keys()
    for user, a in alloc.items():
        assert 0 <= a <= ds[user].ready_mcpu
    assert sum(alloc.values()) <= max(free_mcpu, 0)


@given(free, demands)
def test_work_conserving(free_mcpu: int, ds: dict[str, UserDemand]) -> None:
    alloc = fair_share(free_mcpu, ds)
    total = sum(d.ready_mcpu for d in ds.values())
    if total <= free_mcpu:
        assert alloc == {u: d.ready_mcpu for u, d in ds.items()}
    else:
        assert sum(alloc.values()) == max(free_mcpu, 0)


@given(free, demands, st.integers(0, 50_000), st.integers(0, 50_000))
def test_equal_demands_get_equal_shares(free_mcpu: int, ds: dict[str, UserDemand],
                                        ready: int, running: int) -> None:
    ds = {**ds, "X1": U(ready, running), "X2": U(ready, running)}
    alloc = fair_share(free_mcpu, ds)
    assert abs(alloc["X1"] - alloc["X2"]) <= 1


@given(free, demands, st.integers(0, 50_000), st.integers(0, 50_000), st.integers(0, 50_000))
def test_fewer_running_never_gets_less(free_mcpu: int, ds: dict[str, UserDemand], ready: int,
                                       r1: int, r2: int) -> None:
    low, high = sorted((r1, r2))
    assume(low < high)
    ds = {**ds, "X1": U(ready, high), "X2": U(ready, low)}
    alloc = fair_share(free_mcpu, ds)
    assert alloc["X2"] >= alloc["X1"]


@given(free, demands, st.randoms(use_true_random=False))
def test_permutation_invariant(free_mcpu: int, ds: dict[str, UserDemand], rnd: random.Random,
                               ) -> None:
    items = list(ds.items())
    rnd.shuffle(items)
    assert fair_share(free_mcpu, dict(items)) == fair_share(free_mcpu, ds)


@given(free, demands)
def test_water_level(free_mcpu: int, ds: dict[str, UserDemand]) -> None:
    # Nobody still wanting ends more than 1 mCPU below anybody who received cores: the
    # allocation is the water-filling one, not merely a feasible one.
    alloc = fair_share(free_mcpu, ds)
    totals = {u: d.running_mcpu + alloc[u] for u, d in ds.items()}
    for u, d in ds.items():
        if alloc[u] < d.ready_mcpu:
            for v in ds:
                if alloc[v] > 0:
                    assert totals[u] >= totals[v] - 1


def test_autoscaler_shares() -> None:
    assert autoscaler_shares({"a": 3000, "b": 1000, "c": 0}) == {"a": 225, "b": 75}
    assert autoscaler_shares({"a": 1_000_000, "b": 1}) == {"a": 300, "b": 1}
    assert autoscaler_shares({}) == {}


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=2), st.integers(0, 10**7),
                       max_size=8))
def test_autoscaler_shares_are_proportional(allocations: dict[str, int]) -> None:
    shares = autoscaler_shares(allocations)
    positive = {u for u, a in allocations.items() if a > 0}
    assert shares.keys() == positive
    assert all(s >= 1 for s in shares.values())
    # Rounding moves each share by at most half, the floor of 1 by at most one more.
    assert not positive or abs(sum(shares.values()) - 300) <= len(positive)
    for u in positive:
        for v in positive:
            if allocations[u] >= allocations[v]:
                assert shares[u] >= shares[v]


@dataclass(frozen=True)
class Job:
    cores_mcpu: int
    regions: Collection[str] = ()


def test_estimated_job_queue() -> None:
    shares = {"a": 2, "b": 1}
    heads = {
        "a": [Job(1000), Job(1000, ["us"]), Job(500), Job(500), Job(250)],
        "b": [Job(2000, ["eu"]), Job(2000), Job(2000)],
    }
    entries = estimated_job_queue(shares, heads, window_secs=2)
    # a may take 2*2 = 4 jobs (2 per iteration), b 1*2 = 2 jobs (1 per iteration).
    assert entries == [
        WindowEntry("a", 0, 1000, frozenset()),
        WindowEntry("a", 0, 1000, frozenset({"us"})),
        WindowEntry("b", 0, 2000, frozenset({"eu"})),
        WindowEntry("a", 1, 500, frozenset()),
        WindowEntry("a", 1, 500, frozenset()),
        WindowEntry("b", 1, 2000, frozenset()),
    ]
    assert window_cores_by_user(entries) == {"a": 3000, "b": 4000}
    assert window_cores_by_regions(entries) == {
        frozenset(): 4000, frozenset({"us"}): 1000, frozenset({"eu"}): 2000}


def test_estimated_job_queue_default_window_is_150_seconds() -> None:
    entries = estimated_job_queue({"a": 1}, {"a": [Job(250)] * 200, "z": [Job(1)]})
    assert len(entries) == 150
    assert entries[-1].iteration == 149


def _one_mcpu_at_a_time(free_mcpu: int, ds: dict[str, UserDemand]) -> dict[str, int]:
    """Reference: hand out single mCPU to the wanting user with the lowest running + allocated."""
    alloc = dict.fromkeys(ds, 0)
    for _ in range(max(free_mcpu, 0)):
        wanting = [u for u, d in ds.items() if alloc[u] < d.ready_mcpu]
        if not wanting:
            break
        u = min(wanting, key=lambda u: (ds[u].running_mcpu + alloc[u], ds[u].running_mcpu, u))
        alloc[u] += 1
    return alloc


small_demands = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=2),
    st.builds(UserDemand, st.integers(0, 40), st.integers(0, 40)), max_size=6)


@given(st.integers(-2, 150), small_demands)
def test_matches_one_mcpu_at_a_time_reference(free_mcpu: int, ds: dict[str, UserDemand]) -> None:
    assert fair_share(free_mcpu, ds) == _one_mcpu_at_a_time(free_mcpu, ds)
