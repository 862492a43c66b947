"""Waiting reasons: what a scheduling step reports, and the changes a leader publishes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy import PriorityPlugin, Tiers
from core.priority import REASON_ACTIVE_CORES, UserPriority
from core.scheduler_state import SchedulerState, fold
from core.scheduling import Decisions, schedule
from core.waiting import (
    CODES,
    FAIR_SHARE,
    MAX_JOBS_PER_QUEUE,
    NO_FIT,
    QUEUED,
    QUOTA,
    REGION,
    Published,
    Waiting,
    WaitingKey,
    apply_published,
    changes,
    changes_event,
)
from schemas.batch import JobRecord
from schemas.events import AnyEvent
from schemas.infra import InstanceRequested
from tests.core.test_scheduler_state import Sim, committed, created, instance, jr, submitted

NO_TIERS = Tiers([])


def step(state: SchedulerState, tiers: Tiers = NO_TIERS, *, max_jobs: int = 100,
         max_instances: dict[str, int] | None = None) -> Decisions:
    counter = itertools.count()
    return schedule(state, tiers, max_jobs=max_jobs, new_attempt_id=lambda: f"a{next(counter)}",
                    max_worker_mcpu={"standard": 4000}, max_instances=max_instances)


def codes(d: Decisions) -> dict[tuple[object, ...], str]:
    """Reason codes by key: (user, inst_coll) for a queue, plus (batch, job) for a job."""
    return {tuple(k) if k.batch_id is not None else tuple(k)[:2]: w.reason
            for k, w in d.waiting.items()}


def users(n: int = 4, cores: int = 1000) -> list[AnyEvent]:
    return [created(1, "alice"), created(2, "bob"),
            submitted(1, 1, *(jr(j, cores=cores) for j in range(1, n + 1))), committed(1, 1),
            submitted(2, 1, *(jr(j, cores=cores) for j in range(1, n + 1))), committed(2, 1)]


def one_user(*jobs: JobRecord) -> list[AnyEvent]:
    return [created(1), submitted(1, 1, *jobs), committed(1, 1)]


A, B = ("alice", "standard"), ("bob", "standard")


@pytest.mark.parametrize(("events", "expected"), [
    # alice is stopped at her share; bob's turn ends when the instance is full
    (users() + instance("i1", cores=4000), {A: FAIR_SHARE, B: NO_FIT}),
    (users(2) + instance("i1", cores=8000), {}),
    (one_user(jr(1, regions=["eu"])) + instance("i1", region="us"),
     {A: REGION, (*A, 1, 1): REGION}),
    # backfill: the big head job waits for cores, the small one runs
    (one_user(jr(1, cores=3000), jr(2)) + instance("i1", cores=2000),
     {A: NO_FIT, (*A, 1, 1): NO_FIT}),
    (one_user(jr(1)), {A: NO_FIT}),
    # a job that can never fit is reported unschedulable, not waiting
    (one_user(jr(1, cores=8000)) + instance("i1"), {}),
    (one_user(*(jr(j, regions=["eu"]) for j in range(1, 6))) + instance("i1", region="us"),
     {A: REGION, **{(*A, 1, j): REGION for j in range(1, MAX_JOBS_PER_QUEUE + 1)}}),
], ids=["fair-share", "all-placed", "region", "backfill", "no-instances", "unschedulable",
        "job-entries-bounded"])
def test_reasons(events: list[AnyEvent], expected: dict[tuple[object, ...], str]) -> None:
    assert codes(step(fold(events))) == expected


def test_quota() -> None:
    blocked = Tiers([[PriorityPlugin({"alice": UserPriority(-1.0, REASON_ACTIVE_CORES)})]])
    d = step(fold(users(2) + instance("i1", cores=8000)), blocked)
    assert codes(d) == {A: QUOTA}
    assert d.waiting[WaitingKey(*A)].message.startswith(REASON_ACTIVE_CORES)


def test_the_steps_budget_leaves_queues_waiting_their_turn() -> None:
    d = step(fold(users() + instance("i1", cores=16_000)), max_jobs=3)
    assert len(d.scheduled) == 3
    assert codes(d) == {A: QUEUED, B: QUEUED}


@pytest.mark.parametrize(("extra", "max_instances", "says"), [
    ([], None, "waiting for the autoscaler"),
    ([], {"standard": 2}, "waiting for the autoscaler"),
    ([InstanceRequested(instance_name="i2", inst_coll="standard", machine_type="m",
                        region="us-central1", cores_mcpu=1000, preemptible=True)],
     {"standard": 2}, "the collection is at its maximum of 2 instances"),
], ids=["unbounded", "room", "at-max"])
def test_no_fit_says_whether_more_instances_may_come(
        extra: list[AnyEvent], max_instances: dict[str, int] | None, says: str) -> None:
    state = fold(one_user(jr(1), jr(2)) + instance("i1", cores=1000) + extra)
    d = step(state, max_instances=max_instances)
    assert len(d.scheduled) == 1
    assert d.waiting[WaitingKey(*A)].reason == NO_FIT
    assert d.waiting[WaitingKey(*A)].message.endswith(says)


# --- the step's reasons over random histories -------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_queue_has_a_reason_exactly_when_it_got_fewer_placements_than_ready_jobs(
        data: st.DataObject) -> None:
    sim = Sim(data)
    for _ in range(data.draw(st.integers(1, 25))):
        sim.step()
        state = sim.state
        d = step(state, max_jobs=data.draw(st.integers(1, 12)),
                 max_instances=data.draw(st.sampled_from([None, {"standard": 3}])))
        handled: dict[tuple[str, str], int] = {}
        for b, j in [(e.batch_id, e.job_id) for e in d.scheduled] + [
                (e.batch_id, e.job_id) for e in d.unschedulable]:
            job = state.job(b, j)
            assert job is not None
            key = (state.batches[b].user, job.inst_coll)
            handled[key] = handled.get(key, 0) + 1
        unplaced = {(u.batch_id, u.job_id) for u in d.unplaced}
        for (user, inst_coll), queue in state.ready.items():
            short = handled.get((user, inst_coll), 0) < len(queue)
            assert (WaitingKey(user, inst_coll) in d.waiting) == short
        per_queue: dict[tuple[str, str], int] = {}
        for key, waiting in d.waiting.items():
            assert waiting.reason in CODES and waiting.message
            assert len(state.ready.get((key.user, key.inst_coll), ())) > 0
            if key.batch_id is not None:
                assert key.job_id is not None and (key.batch_id, key.job_id) in unplaced
                assert (key.batch_id, key.job_id) in state.ready[(key.user, key.inst_coll)]
                assert waiting.reason in (REGION, NO_FIT)
                assert WaitingKey(key.user, key.inst_coll) in d.waiting
                q = (key.user, key.inst_coll)
                per_queue[q] = per_queue.get(q, 0) + 1
        assert all(n <= MAX_JOBS_PER_QUEUE for n in per_queue.values())


# --- publishing changes ---------------------------------------------------------------------

keys = st.builds(lambda user, coll, job: WaitingKey(user, coll, job, job),
                 st.sampled_from(["alice", "bob"]), st.sampled_from(["standard", "highmem"]),
                 st.one_of(st.none(), st.integers(1, 3)))
waitings = st.builds(Waiting, st.sampled_from([FAIR_SHARE, NO_FIT, REGION]),
                     st.sampled_from(["m1", "m2"]))
maps = st.dictionaries(keys, waitings, max_size=12)


def publish(published: dict[WaitingKey, Published], current: dict[WaitingKey, Waiting],
            now: int, limit: int, first: bool = False) -> int:
    """Publish until nothing differs, as a leader does over several rounds; the events sent."""
    sent, bound = 0, -(-(len(current) + len(published)) // limit) + 1
    while (event := changes_event(published, current, epoch=1, now_ms=now, limit=limit,
                                  first=first)) is not None:
        assert len(event.entries) <= limit
        apply_published(published, event, now)
        sent += 1
        first = False
        assert sent <= bound  # each event but an empty first one makes progress
    return sent


@settings(max_examples=200, deadline=None)
@given(st.lists(maps, min_size=1, max_size=6), st.integers(1, 5))
def test_published_reasons_converge_to_the_latest_step(
        rounds: list[dict[WaitingKey, Waiting]], limit: int) -> None:
    published: dict[WaitingKey, Published] = {}
    for now, current in enumerate(rounds):
        before = dict(published)
        publish(published, current, now, limit, first=now == 0)
        assert {k: p.waiting for k, p in published.items()} == current
        for k, p in published.items():
            old = before.get(k)
            kept = old is not None and old.waiting.reason == p.waiting.reason
            assert p.since_ms == (old.since_ms if kept and old is not None else now)
        assert changes(published, current) == []


def test_only_changes_are_sent_and_cleared_entries_say_so() -> None:
    alice, job = WaitingKey("alice", "standard"), WaitingKey("alice", "standard", 1, 1)
    published: dict[WaitingKey, Published] = {}
    first = changes_event(published, {}, epoch=2, now_ms=5, first=True)
    assert first is not None and first.entries == [] and first.epoch == 2
    assert changes_event(published, {}, epoch=2, now_ms=5) is None
    current = {alice: Waiting(FAIR_SHARE, "x"), job: Waiting(REGION, "y")}
    event = changes_event(published, current, epoch=2, now_ms=10)
    assert event is not None
    assert [(e.batch_id, e.reason, e.since_ms) for e in event.entries] == [
        (None, FAIR_SHARE, 10), (1, REGION, 10)]
    apply_published(published, event, 10)
    event = changes_event(published, {alice: Waiting(FAIR_SHARE, "z")}, epoch=2, now_ms=20)
    assert event is not None
    assert [(e.batch_id, e.reason, e.message, e.since_ms) for e in event.entries] == [
        (None, FAIR_SHARE, "z", 10), (1, None, "", None)]
