from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.policy import (
    REASON_FAIR_SHARE,
    REASON_NO_FIT,
    REASON_NO_INSTANCES,
    REASON_REGION,
    FairSharePlugin,
    FitPlugin,
    OrderKey,
    Plugin,
    Policy,
    PriorityPlugin,
    SchedInstance,
    SchedJob,
    Tiers,
)
from core.priority import BLOCKED_PRIORITY, REASON_ACTIVE_CORES, REASON_COST, UserPriority


@dataclass(frozen=True)
class Job:
    batch_id: int
    job_id: int
    user: str = "a"
    cores_mcpu: int = 1000
    regions: Collection[str] = ()


@dataclass(frozen=True)
class Inst:
    name: str
    free_cores_mcpu: int = 16_000
    region: str = "us-central1"


@dataclass(frozen=True)
class Static(Plugin):
    """A test plugin with fixed keys and a fixed verdict."""

    name: str
    queue: dict[str, OrderKey] | None = None
    jobs: dict[int, OrderKey] | None = None
    refuse: str | None = None

    def queue_order(self, user: str) -> OrderKey | None:
        return None if self.queue is None else self.queue[user]

    def job_order(self, job: SchedJob) -> OrderKey | None:
        return None if self.jobs is None else self.jobs[job.job_id]

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        return self.refuse


def test_plugins_are_policies() -> None:
    plugins: list[Policy] = [FitPlugin(), FairSharePlugin({}), PriorityPlugin({}), Plugin()]
    assert [p.name for p in plugins] == ["fit", "fair-share", "priority", "plugin"]


def test_first_tier_with_a_preference_decides_queue_order() -> None:
    first = Static("first", queue={"a": (1,), "b": (0,), "c": (1,)})
    second = Static("second", queue={"a": (1,), "b": (9,), "c": (0,)})
    # first says b before a and c; a and c are equal to it, so second breaks the tie (c, a).
    assert Tiers([[first], [second]]).order_users("abc") == ["b", "c", "a"]
    # Swap the tiers and second decides outright.
    assert Tiers([[second], [first]]).order_users("abc") == ["c", "a", "b"]


def test_no_opinion_passes_to_the_next_tier_and_then_the_fallback() -> None:
    silent = Static("silent")
    deciding = Static("deciding", queue={"a": (2,), "b": (1,), "c": (1,)})
    assert Tiers([[silent], [deciding]]).order_users("cab") == ["b", "c", "a"]
    # Nobody has an opinion: users by name.
    assert Tiers([[silent], [Plugin()]]).order_users("cab") == ["a", "b", "c"]
    assert Tiers([]).order_users("cab") == ["a", "b", "c"]


def test_plugins_within_a_tier_are_asked_in_order() -> None:
    p1 = Static("p1", queue={"a": (0,), "b": (0,)})
    p2 = Static("p2", queue={"a": (1,), "b": (0,)})
    assert Tiers([[p1, p2]]).order_users("ab") == ["b", "a"]


def test_job_order_falls_back_to_batch_and_job_id() -> None:
    jobs = [Job(2, 1), Job(1, 2), Job(1, 1), Job(1, 3)]
    assert Tiers([[Plugin()]]).order_jobs(jobs) == [Job(1, 1), Job(1, 2), Job(1, 3), Job(2, 1)]
    by_key = Static("k", jobs={1: (5,), 2: (0,), 3: (5,)})
    assert Tiers([[by_key]]).order_jobs(jobs) == [Job(1, 2), Job(1, 1), Job(1, 3), Job(2, 1)]


def test_predicates_of_all_tiers_run_and_the_first_reason_wins() -> None:
    ok, no_a, no_b = Static("ok"), Static("a", refuse="a says no"), Static("b", refuse="b says no")
    job, inst = Job(1, 1), Inst("i")
    assert Tiers([[ok], [ok]]).check(job, inst) is None
    assert Tiers([[ok], [no_b]]).check(job, inst) == "b says no"
    assert Tiers([[no_a], [no_b]]).check(job, inst) == "a says no"
    assert Tiers([[ok, no_b, no_a]]).check(job, inst) == "b says no"


@pytest.mark.parametrize(("job", "inst", "reason"), [
    (Job(1, 1, cores_mcpu=1000), Inst("i", free_cores_mcpu=1000), None),
    (Job(1, 1, cores_mcpu=1001), Inst("i", free_cores_mcpu=1000), REASON_NO_FIT),
    (Job(1, 1, regions=["us-central1", "us-east1"]), Inst("i"), None),
    (Job(1, 1, regions=["europe-west1"]), Inst("i"), REASON_REGION),
    (Job(1, 1, cores_mcpu=10**6, regions=["europe-west1"]), Inst("i"), REASON_REGION),
    (Job(1, 1, regions=[]), Inst("i", region="anywhere"), None),
], ids=["fits-exactly", "too-big", "region-listed", "wrong-region", "region-first", "any-region"])
def test_fit_predicate(job: Job, inst: Inst, reason: str | None) -> None:
    assert FitPlugin().predicate(job, inst) == reason


def test_place_picks_the_first_allowed_instance_or_reports_reasons() -> None:
    tiers = Tiers([[FitPlugin()]])
    small, eu, big = Inst("small", 500), Inst("eu", region="europe-west1"), Inst("big")
    assert tiers.place(Job(1, 1), [small, eu, big]) == eu
    assert tiers.place(Job(1, 1, regions=["us-central1"]), [small, eu, big]) == big
    assert tiers.place(Job(1, 1, regions=["europe-west1"]), [small, eu, big]) == eu
    assert tiers.place(Job(1, 1, cores_mcpu=32_000, regions=["us-central1"]),
                       [eu, small, big]) == (REASON_REGION, REASON_NO_FIT)
    assert tiers.place(Job(1, 1, cores_mcpu=32_000), [small, big]) == (REASON_NO_FIT,)
    assert tiers.place(Job(1, 1, regions=["asia"]), [small, big]) == (REASON_REGION,)
    assert tiers.place(Job(1, 1), []) == (REASON_NO_INSTANCES,)


def test_fair_share_plugin() -> None:
    plugin = FairSharePlugin({"a": 4000, "b": 1000, "c": 3000}, scheduled={"a": 3500})
    # Deficits: a 500, b 1000, c 3000, d 0 (no allocation).
    assert Tiers([[plugin]]).order_users("abcd") == ["c", "b", "a", "d"]
    inst = Inst("i")
    assert plugin.predicate(Job(1, 1, user="a"), inst) is None
    assert plugin.predicate(Job(1, 1, user="d"), inst) == REASON_FAIR_SHARE
    spent = FairSharePlugin({"a": 4000}, scheduled={"a": 4500})
    assert spent.deficit("a") == -500
    assert spent.predicate(Job(1, 1, user="a"), inst) == REASON_FAIR_SHARE


def test_priority_plugin() -> None:
    plugin = PriorityPlugin({
        "low": UserPriority(0.5),
        "boosted": UserPriority(10.7, boost=10),
        "capped": UserPriority(BLOCKED_PRIORITY, REASON_ACTIVE_CORES),
        "broke": UserPriority(BLOCKED_PRIORITY, REASON_COST),
    })
    assert Tiers([[plugin]]).order_users(["low", "unknown", "capped", "boosted"]) == [
        "boosted", "low", "capped", "unknown"]
    inst = Inst("i")
    assert plugin.predicate(Job(1, 1, user="capped"), inst) == "quota: max active cores"
    assert plugin.predicate(Job(1, 1, user="broke"), inst) == "quota: max 24h cost"
    assert plugin.predicate(Job(1, 1, user="low"), inst) is None
    assert plugin.predicate(Job(1, 1, user="unknown"), inst) is None


def test_a_realistic_stack() -> None:
    # Tier 1: quotas and priority; tier 2: fair share; predicates from every tier.
    prio = PriorityPlugin({"a": UserPriority(1.0), "b": UserPriority(1.0),
                           "c": UserPriority(BLOCKED_PRIORITY, REASON_ACTIVE_CORES)})
    fair = FairSharePlugin({"a": 1000, "b": 3000, "c": 5000})
    tiers = Tiers([[prio], [fair, FitPlugin()]])
    assert tiers.order_users("abc") == ["b", "a", "c"]
    inst = Inst("i", free_cores_mcpu=2000)
    assert tiers.check(Job(1, 1, user="c"), inst) == REASON_ACTIVE_CORES
    assert tiers.check(Job(1, 1, user="b", cores_mcpu=4000), inst) == REASON_NO_FIT
    assert tiers.check(Job(1, 1, user="b"), inst) is None


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10_000)),
       st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10_000)))
def test_fair_share_order_is_by_deficit(alloc: dict[str, int], sched: dict[str, int]) -> None:
    plugin = FairSharePlugin(alloc, sched)
    ordered = Tiers([[plugin]]).order_users("abcdef")
    deficits = [plugin.deficit(u) for u in ordered]
    assert deficits == sorted(deficits, reverse=True)
