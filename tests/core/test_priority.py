from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.priority import (
    BLOCKED_PRIORITY,
    REASON_ACTIVE_CORES,
    REASON_CORE_TIME,
    REASON_COST,
    PrioritySettings,
    UserPriority,
    UserQuota,
    UserUsage,
    boost,
    compute_priorities,
    quota_block,
    user_priority,
)

Q = UserQuota(baseline_priority=100, max_active_cores_mcpu=100_000, max_cost_24h=10_000_000)


@pytest.mark.parametrize(("cost", "expected"), [
    (0, 10), (99_999, 10), (100_000, 10), (350_000, 7), (550_000, 5), (1_000_000, 0),
    (1_000_001, 0), (10**12, 0),
    # 10 * 955_000 / 900_000 away from the top: 0.5 exactly rounds up (Java Math.round).
    (955_000, 1), (955_001, 0),
], ids=str)
def test_boost(cost: int, expected: int) -> None:
    # 350,000 is the thesis's worked example: 7.222 rounds to 7.
    assert boost(cost) == expected


@pytest.mark.parametrize(("usage", "reason"), [
    (UserUsage(), None),
    (UserUsage(active_cores_mcpu=99_999, cost_24h=9_999_999), None),
    (UserUsage(active_cores_mcpu=100_000), REASON_ACTIVE_CORES),
    (UserUsage(active_cores_mcpu=200_000, cost_24h=10**9), REASON_ACTIVE_CORES),
    (UserUsage(cost_24h=10_000_000), REASON_COST),
    (UserUsage(core_seconds_24h=10**15), None),
], ids=repr)
def test_quota_block(usage: UserUsage, reason: str | None) -> None:
    assert quota_block(Q, usage) == reason


def test_core_time_quota_is_optional() -> None:
    q = UserQuota(baseline_priority=1, max_active_cores_mcpu=1000, max_cost_24h=10,
                  max_core_seconds_24h=3600)
    assert quota_block(q, UserUsage(core_seconds_24h=3599)) is None
    assert quota_block(q, UserUsage(core_seconds_24h=3600)) == REASON_CORE_TIME
    assert user_priority(q, UserUsage(core_seconds_24h=3600), 1) == UserPriority(
        BLOCKED_PRIORITY, REASON_CORE_TIME)


def test_worked_examples() -> None:
    # Idle user with the highest baseline: w = 0, full boost -> 10 + 1.
    assert user_priority(Q, UserUsage(), 100).priority == pytest.approx(11.0)
    # Half the baseline of the top user, idle: w = 0.4 * 0.5 = 0.2 -> 10.8.
    assert user_priority(Q, UserUsage(), 200).priority == pytest.approx(10.8)
    # Busy: half the cores, cost 2.5M of 10M (sqrt 0.5), no boost, top baseline:
    # w = 0.1 * 0.5 + 0.5 * 0.5 = 0.3 -> 0.7.
    p = user_priority(Q, UserUsage(active_cores_mcpu=50_000, cost_24h=2_500_000), 100)
    assert p.priority == pytest.approx(0.7)
    assert (p.boost, p.blocked) == (0, None)
    # Thesis example cost 350,000: boost 7; w = 0.1 * sqrt(0.035) -> 8 - 0.0187.
    p = user_priority(Q, UserUsage(cost_24h=350_000), 100)
    assert p.priority == pytest.approx(8 - 0.1 * math.sqrt(0.035))


def test_compute_priorities_normalises_by_highest_baseline() -> None:
    quotas = {
        "prod": UserQuota(baseline_priority=1000, max_active_cores_mcpu=10**6, max_cost_24h=10**9),
        "ana": UserQuota(baseline_priority=250, max_active_cores_mcpu=10**6, max_cost_24h=10**9),
        "busy": UserQuota(baseline_priority=1000, max_active_cores_mcpu=1000, max_cost_24h=10**9),
    }
    usage = {"busy": UserUsage(active_cores_mcpu=1000)}
    result = compute_priorities(quotas, usage)
    assert result["prod"].priority == pytest.approx(11.0)
    assert result["ana"].priority == pytest.approx(11.0 - 0.4 * 0.75)
    assert result["busy"] == UserPriority(BLOCKED_PRIORITY, REASON_ACTIVE_CORES)


def test_settings_are_used() -> None:
    s = PrioritySettings(max_boost=0)
    assert user_priority(Q, UserUsage(), 100, s).priority == pytest.approx(1.0)


quotas = st.builds(
    UserQuota,
    baseline_priority=st.integers(1, 20_000),
    max_active_cores_mcpu=st.integers(1, 10**7),
    max_cost_24h=st.integers(1, 10**14),
    max_core_seconds_24h=st.none() | st.integers(1, 10**12),
)
usages = st.builds(
    UserUsage,
    active_cores_mcpu=st.integers(0, 10**7),
    cost_24h=st.integers(0, 10**14),
    core_seconds_24h=st.integers(0, 10**12),
)
extra = st.integers(0, 10**13)


@given(quotas, usages, st.integers(1, 20_000), extra, extra, extra)
def test_more_use_never_raises_priority(q: UserQuota, u: UserUsage, top: int, d_cores: int,
                                        d_cost: int, d_time: int) -> None:
    more = UserUsage(active_cores_mcpu=u.active_cores_mcpu + d_cores,
                     cost_24h=u.cost_24h + d_cost, core_seconds_24h=u.core_seconds_24h + d_time)
    assert user_priority(q, more, top).priority <= user_priority(q, u, top).priority


@given(quotas, usages, extra)
def test_more_cost_alone_never_raises_priority(q: UserQuota, u: UserUsage, d_cost: int) -> None:
    more = UserUsage(active_cores_mcpu=u.active_cores_mcpu, cost_24h=u.cost_24h + d_cost,
                     core_seconds_24h=u.core_seconds_24h)
    assert user_priority(q, more, 20_000).priority <= user_priority(q, u, 20_000).priority


@given(quotas, usages, st.integers(0, 20_000), st.lists(st.integers(1, 20_000), max_size=4))
def test_higher_baseline_never_lowers_priority(q: UserQuota, u: UserUsage, d: int,
                                               others: list[int]) -> None:
    def mine(baseline: int) -> float:
        me = UserQuota(baseline_priority=baseline, max_active_cores_mcpu=q.max_active_cores_mcpu,
                       max_cost_24h=q.max_cost_24h, max_core_seconds_24h=q.max_core_seconds_24h)
        population = {f"o{i}": UserQuota(baseline_priority=b, max_active_cores_mcpu=1,
                                         max_cost_24h=1) for i, b in enumerate(others)}
        return compute_priorities({**population, "me": me}, {"me": u})["me"].priority

    assert mine(q.baseline_priority + d) >= mine(q.baseline_priority)


@given(quotas, usages, st.integers(1, 20_000))
def test_blocked_iff_at_or_over_a_quota(q: UserQuota, u: UserUsage, top: int) -> None:
    p = user_priority(q, u, top)
    over = (u.active_cores_mcpu >= q.max_active_cores_mcpu or u.cost_24h >= q.max_cost_24h
            or (q.max_core_seconds_24h is not None
                and u.core_seconds_24h >= q.max_core_seconds_24h))
    assert (p.blocked is not None) == over
    if over:
        assert p.priority == BLOCKED_PRIORITY
    else:
        assert 0.0 <= p.priority <= 11.0


@given(quotas, usages, st.integers(1, 20_000))
def test_at_max_active_cores_is_blocked(q: UserQuota, u: UserUsage, top: int) -> None:
    at = UserUsage(active_cores_mcpu=q.max_active_cores_mcpu, cost_24h=u.cost_24h,
                   core_seconds_24h=u.core_seconds_24h)
    assert user_priority(q, at, top).blocked == REASON_ACTIVE_CORES


@given(quotas, st.integers(0, 10**7), st.integers(1, 20_000))
def test_at_max_cost_is_blocked(q: UserQuota, cores: int, top: int) -> None:
    at = UserUsage(active_cores_mcpu=min(cores, q.max_active_cores_mcpu - 1),
                   cost_24h=q.max_cost_24h)
    assert user_priority(q, at, top).blocked == REASON_COST


@given(st.integers(0, 2 * 10**6), st.integers(0, 2 * 10**6))
def test_boost_is_non_increasing_and_bounded(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert 0 <= boost(hi) <= boost(lo) <= 10
