"""The scheduler's priority policy: usage measured from the folded state orders users and
enforces quotas (no I/O: the state is built from events)."""

from __future__ import annotations

import pytest

from core.scheduler_state import SchedulerState, fold
from schemas.batch import BatchCreated
from services.scheduler.policy import PriorityPolicy, QuotaSettings, UsageMeter, parse_quotas
from services.scheduler.settings import load_scheduler_settings
from tests.core.test_scheduler_state import committed, instance, jr, sj, submitted


def _state() -> SchedulerState:
    """alice runs 4 cores and has a job waiting; bob has a job waiting and runs nothing."""
    return fold([
        *instance("i1", cores=16_000),
        BatchCreated(batch_id=1, user="alice", billing_project="p", token="t1"),
        submitted(1, 1, *(jr(j) for j in range(1, 6))), committed(1, 1),
        *(sj(1, j, attempt=f"a{j}") for j in range(1, 5)),
        BatchCreated(batch_id=2, user="bob", billing_project="p", token="t2"),
        submitted(2, 1, jr(1)), committed(2, 1),
    ])


def test_the_user_who_used_less_goes_first() -> None:
    policy = PriorityPolicy({}, QuotaSettings(), cost_per_core_s=1)
    state = _state()
    policy.tiers(state, 0.0)
    tiers = policy.tiers(state, 600.0)
    assert policy.meter.core_seconds() == {"alice": 4 * 600}
    assert tiers.order_users(["alice", "bob"]) == ["bob", "alice"]


def test_a_user_over_the_active_cores_quota_is_refused() -> None:
    quotas = parse_quotas('{"alice": {"baseline_priority": 5000, "max_active_cores_mcpu": 2000}}')
    tiers = PriorityPolicy(quotas, QuotaSettings(), 1).tiers(_state(), 0.0)
    (plugin,) = tiers.tiers[0]
    assert plugin.priorities["alice"].blocked is not None
    assert plugin.priorities["bob"].blocked is None


def test_usage_older_than_a_day_is_forgotten() -> None:
    meter, state = UsageMeter(), _state()
    meter.observe(state, 0.0)
    meter.observe(state, 100.0)
    assert meter.core_seconds() == {"alice": 400}
    meter.observe(state, 25 * 3600.0)  # 4 cores for the whole day since: the old hour is gone
    assert meter.core_seconds()["alice"] == int(4 * (25 * 3600.0 - 100.0))
    meter.observe(state, 60 * 3600.0)
    assert meter.core_seconds()["alice"] == int(4 * 35 * 3600.0)


@pytest.mark.parametrize(("env", "message"), [
    ({"HS_SCHEDULER_POLICY": "lottery"}, "HS_SCHEDULER_POLICY"),
    ({"HS_SCHEDULER_MAX_INSTANCES": "many"}, "HS_SCHEDULER_MAX_INSTANCES"),
], ids=["unknown policy", "not a number"])
def test_bad_settings_are_refused_clearly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_scheduler_settings(env)


def test_malformed_quotas_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="HS_SCHEDULER_QUOTAS"):
        parse_quotas('{"alice": {"baseline_priority": "high"}}')
