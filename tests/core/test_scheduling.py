from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy import (
    REASON_FAIR_SHARE,
    REASON_NO_FIT,
    REASON_NO_INSTANCES,
    REASON_REGION,
    OrderKey,
    Plugin,
    PriorityPlugin,
    SchedJob,
    Tiers,
)
from core.priority import REASON_ACTIVE_CORES, UserPriority
from core.scheduler_state import READY, SchedulerState, fold
from core.scheduling import (
    Decisions,
    Kill,
    bunches,
    cancel_shares,
    cancellations,
    failure_cancellations,
    schedule,
)
from schemas.base import AttemptResource
from schemas.batch import BatchCancelled, JobGroupCancelled, JobRecord
from schemas.events import AnyEvent
from schemas.execution import JobScheduled
from schemas.infra import InstanceDeactivated
from tests.core.test_scheduler_state import (
    Sim,
    at_epoch,
    check_invariants,
    committed,
    created,
    groups,
    instance,
    jr,
    mjc,
    sj,
    submitted,
)

NO_TIERS = Tiers([])


class _NoOpinion(Plugin):
    name = "no-opinion"

    def job_order(self, job: SchedJob) -> OrderKey | None:
        return None


def _decided(d: Decisions) -> tuple[object, ...]:
    return ([(e.batch_id, e.job_id, e.instance_name, e.cores_mcpu) for e in d.scheduled],
            d.unplaced, d.unschedulable, d.waiting, d.allocations)


def ids() -> itertools.count[int]:
    return itertools.count()


def step(state: SchedulerState, tiers: Tiers = NO_TIERS, max_jobs: int = 100,
         max_worker: dict[str, int] | None = None) -> tuple[list[tuple[int, int, str]], dict[
             tuple[int, int], tuple[str, ...]]]:
    counter = ids()
    d = schedule(state, tiers, max_jobs=max_jobs, new_attempt_id=lambda: f"a{next(counter)}",
                 max_worker_mcpu=max_worker)
    placed = [(e.batch_id, e.job_id, e.instance_name) for e in d.scheduled]
    reasons = {(u.batch_id, u.job_id): u.reasons for u in d.unplaced}
    reasons |= {(e.batch_id, e.job_id): ("permanent: " + e.reason,) for e in d.unschedulable}
    return placed, reasons


def two_users(n: int = 4, cores: int = 1000) -> list[AnyEvent]:
    return [created(1, "alice"), created(2, "bob"),
            submitted(1, 1, *(jr(j, cores=cores) for j in range(1, n + 1))), committed(1, 1),
            submitted(2, 1, *(jr(j, cores=cores) for j in range(1, n + 1))), committed(2, 1)]


def test_fair_share_splits_an_instance_between_users() -> None:
    placed, reasons = step(fold([*two_users(), *instance("i1", cores=4000)]))
    assert placed == [(1, 1, "i1"), (1, 2, "i1"), (2, 1, "i1"), (2, 2, "i1")]
    # alice's turn ends at her share; bob's ends when the instance is full (nothing left to try)
    assert reasons == {(1, 3): (REASON_FAIR_SHARE,)}


def test_running_cores_lower_a_users_share() -> None:
    state = fold([*two_users(), *instance("i0", cores=2000), sj(1, 1, inst="i0"),
                  sj(1, 2, "a2", inst="i0"), *instance("i1", cores=2000)])
    placed, _ = step(state)
    assert placed == [(2, 1, "i1"), (2, 2, "i1")]


@pytest.mark.parametrize(("jobs", "instances", "expected_placed", "expected_reasons"), [
    ([jr(1, regions=["eu"])], instance("i1", region="us"), [], {(1, 1): (REASON_REGION,)}),
    ([jr(1, regions=["eu"])], [*instance("i1", region="us"), *instance("i2", region="eu")],
     [(1, 1, "i2")], {}),
    ([jr(1, cores=3000), jr(2, cores=1000)], instance("i1", cores=2000),
     [(1, 2, "i1")], {(1, 1): (REASON_NO_FIT,)}),
    ([jr(1)], [], [], {(1, 1): (REASON_NO_INSTANCES,)}),
    ([jr(1)], [*instance("i1"), InstanceDeactivated(instance_name="i1", reason="idle")],
     [], {(1, 1): (REASON_NO_INSTANCES,)}),
    ([jr(1, cores=8000), jr(2)], instance("i1"), [(1, 2, "i1")],
     {(1, 1): ("permanent: needs 8000 mCPU; the largest standard worker has 4000 mCPU",)}),
    ([jr(1, ic="highmem")], instance("i1"), [], {(1, 1): (REASON_NO_INSTANCES,)}),
], ids=["region", "region-matches", "backfill", "no-instances", "inactive", "too-big",
        "other-coll"])
def test_placement(jobs: list[JobRecord], instances: list[AnyEvent],
                   expected_placed: list[tuple[int, int, str]],
                   expected_reasons: dict[tuple[int, int], tuple[str, ...]]) -> None:
    state = fold([created(1), submitted(1, 1, *jobs), committed(1, 1), *instances])
    placed, reasons = step(state, max_worker={"standard": 4000})
    assert placed == expected_placed
    assert reasons == expected_reasons


class _LastFirst(Plugin):
    name = "last-first"

    def job_order(self, job: SchedJob) -> OrderKey | None:
        return (-job.job_id,)


@pytest.mark.parametrize("max_jobs", [1, 5, 12, 13, 30, 100])
@pytest.mark.parametrize("free", [500, 4000, 40_000])
def test_queues_are_walked_lazily_in_job_order(max_jobs: int, free: int) -> None:
    state = fold([*two_users(12, cores=250), *instance("i1", cores=free)])
    counter = ids()
    lazy = schedule(state, NO_TIERS, max_jobs=max_jobs,
                    new_attempt_id=lambda: f"a{next(counter)}")
    counter = ids()
    sorted_path = schedule(state, Tiers([[_NoOpinion()]]), max_jobs=max_jobs,
                           new_attempt_id=lambda: f"a{next(counter)}")
    assert _decided(lazy) == _decided(sorted_path)
    assert lazy.scheduled  # there was something to decide
    # An opinion still orders the jobs: the last of alice's queue goes first.
    if free == 500 and max_jobs >= 30:
        opinion = schedule(state, Tiers([[_LastFirst()]]), max_jobs=max_jobs,
                           new_attempt_id=lambda: "x")
        assert [(e.batch_id, e.job_id) for e in opinion.scheduled] == [(1, 12), (2, 12)]


def test_quota_blocks_a_user_and_priority_orders_users() -> None:
    state = fold([*two_users(2), *instance("i1", cores=8000)])
    blocked = Tiers([[PriorityPlugin({"alice": UserPriority(-1.0, REASON_ACTIVE_CORES),
                                      "bob": UserPriority(5.0)})]])
    placed, reasons = step(state, blocked)
    assert placed == [(2, 1, "i1"), (2, 2, "i1")]
    assert reasons == {(1, 1): (REASON_ACTIVE_CORES,)}


def test_max_jobs_bounds_the_work_of_a_step() -> None:
    placed, reasons = step(fold([*two_users(), *instance("i1", cores=16_000)]), max_jobs=3)
    assert len(placed) + len(reasons) == 3


def test_a_step_does_not_change_the_state() -> None:
    events = [*two_users(), *instance("i1")]
    state = fold(events)
    step(state)
    assert state == fold(events)


def test_uncommitted_jobs_are_never_scheduled() -> None:
    state = fold([created(1), submitted(1, 1, jr(1)), submitted(1, 2, jr(2)), committed(1, 2),
                  *instance("i1")])
    assert step(state)[0] == [(1, 2, "i1")]


@pytest.mark.parametrize(("counts", "expected"), [
    ({}, {}),
    ({"a": 0}, {}),
    ({"a": 1000}, {"a": 300}),
    ({"a": 900, "b": 100}, {"a": 270, "b": 30}),
    ({"a": 990, "b": 10}, {"a": 297, "b": 20}),
    ({"a": 5, "b": 5}, {"a": 150, "b": 150}),
], ids=repr)
def test_cancel_shares(counts: dict[str, int], expected: dict[str, int]) -> None:
    assert cancel_shares(counts) == expected


def test_cancellations_cancel_ready_jobs_and_kill_running_ones() -> None:
    state = fold([*two_users(3), *instance("i1"), sj(1, 1), BatchCancelled(batch_id=1)])
    picked = cancellations(state)
    assert len(picked.cancelled) == 1  # the batch's Ready jobs, in one record
    assert [(e.batch_id, e.job_id, e.reason) for bunch in picked.cancelled
            for e in bunch.expand()] == [(1, 2, "user"), (1, 3, "user")]
    assert picked.kills == [Kill(1, 1, "a1", "i1")]
    for event in picked.cancelled:
        state.apply(event)
    assert state.job(1, 2) is None and len(state.to_cancel["alice"]) == 1
    check_invariants(state)


def test_cancellations_share_fairly() -> None:
    events: list[AnyEvent] = [created(1, "alice"), created(2, "bob"),
                              submitted(1, 1, *(jr(j) for j in range(1, 1001))), committed(1, 1),
                              submitted(2, 1, *(jr(j) for j in range(1, 6))), committed(2, 1),
                              BatchCancelled(batch_id=1), BatchCancelled(batch_id=2)]
    picked = cancellations(fold(events))
    per_batch = {b: sum(len(e.job_ids) for e in picked.cancelled if e.batch_id == b)
                 for b in (1, 2)}
    assert per_batch == {1: 299, 2: 5}
    assert [(e.batch_id, e.reason) for e in picked.cancelled] == [(1, "user"), (2, "user")]


def test_cancellations_bunch_per_batch_and_reason() -> None:
    """A batch whose jobs are cancelled for different reasons gets a bunch per reason."""
    events: list[AnyEvent] = [created(1, "alice"), *instance("i1"),
                              groups(1, 1, (1, 0)),
                              submitted(1, 1, jr(1, group=1), jr(2), jr(3, group=1), jr(4)),
                              committed(1, 1), JobGroupCancelled(batch_id=1, job_group_id=1,
                                                                 reason="n_failures"),
                              BatchCancelled(batch_id=1)]
    picked = cancellations(fold(events))
    assert sorted((e.reason, tuple(e.job_ids)) for e in picked.cancelled) == [
        ("n_failures", (1, 3)), ("user", (2, 4))]


def test_failure_cancellations_cancel_groups_that_reached_their_limit() -> None:
    events: list[AnyEvent] = [
        created(2, n_failures=1), created(1), *instance("i1", cores=16_000),
        groups(1, 1, (1, 0), (2, 0), limits={1: 1, 2: 5}),
        submitted(1, 1, jr(1, group=1), jr(2, group=1), jr(3, group=2)), committed(1, 1),
        submitted(2, 1, jr(1)), committed(2, 1)]
    events += [sj(2, 1, "x"), mjc(2, 1, "Error", "x"), sj(1, 1), mjc(1, 1, "Failed"),
               sj(1, 3, "a3"), mjc(1, 3, "Failed", "a3")]
    state = fold(events)
    picked = failure_cancellations(state)
    assert picked == [JobGroupCancelled(batch_id=1, job_group_id=1, reason="n_failures"),
                      BatchCancelled(batch_id=2, reason="n_failures")]
    assert failure_cancellations(state) == picked  # repeated until folded
    for event in picked:
        state.apply(event)
    assert failure_cancellations(state) == []
    job = state.job(1, 2)
    assert job is not None and job.cancel == "n_failures"
    check_invariants(state)


# --- properties over random legal histories ------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.data())
def test_steps_over_random_histories(data: st.DataObject) -> None:
    sim = Sim(data)
    counter = ids()
    for _ in range(data.draw(st.integers(1, 30))):
        if data.draw(st.booleans()):
            sim.step()
            continue
        state = sim.state
        before = {name: inst.free_mcpu for name, inst in state.instances.items()}
        max_jobs = data.draw(st.integers(1, 20))
        d = schedule(state, NO_TIERS, max_jobs=max_jobs,
                     new_attempt_id=lambda: f"s{next(counter)}",
                     max_worker_mcpu={"standard": 2000})
        # Without a job-order opinion the step walks each queue lazily; a plugin that only
        # overrides job_order (with no opinion) takes the sorting path: same decisions.
        sorted_path = schedule(state, Tiers([[_NoOpinion()]]), max_jobs=max_jobs,
                               new_attempt_id=lambda: "x", max_worker_mcpu={"standard": 2000})
        assert _decided(sorted_path) == _decided(d)
        used: dict[str, int] = {}
        for e in d.scheduled:
            job = state.job(e.batch_id, e.job_id)
            batch = state.batches[e.batch_id]
            # only Ready, not cancelled, committed jobs are placed
            assert job is not None and job.state == READY and job.cancel is None
            assert (e.batch_id, e.job_id) in state.ready[(batch.user, job.inst_coll)]
            inst = state.instances[e.instance_name]
            assert inst.active and inst.inst_coll == job.inst_coll
            assert not job.regions or inst.region in job.regions
            assert job.cores_mcpu <= 2000
            used[e.instance_name] = used.get(e.instance_name, 0) + e.cores_mcpu
        assert all(used[n] <= before[n] for n in used)
        assert len({(e.batch_id, e.job_id) for e in d.scheduled}) == len(d.scheduled)
        for u in d.unschedulable:
            assert (job := state.job(u.batch_id, u.job_id)) is not None and job.cores_mcpu > 2000
        sj_events: list[JobScheduled | AnyEvent] = [*d.scheduled, *d.unschedulable]
        for event in sj_events:
            sim.emit(at_epoch(event, state.epoch, next(counter)) if isinstance(
                event, JobScheduled) else event)
        assert all(inst.free_mcpu >= 0 for inst in sim.state.instances.values())
        for event in cancellations(sim.state, data.draw(st.integers(1, 10)),
                                   min_per_user=1).cancelled:
            sim.emit(event)
        for cancel in failure_cancellations(sim.state):
            sim.emit(cancel)
        assert not sim.state.failure_cancels
        sim.check()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 50)), max_size=60),
       st.integers(1, 7))
def test_bunches_say_what_the_single_sjs_say(placements: list[tuple[int, int]],
                                             max_attempts: int) -> None:
    billed = [AttemptResource(resource="compute/n1-standard/1", quantity=1000)]
    sjs = [JobScheduled(batch_id=b, job_id=j, attempt_id=f"a{i}", instance_name=f"w{i % 3}",
                        inst_coll="standard", cores_mcpu=250 * (1 + i % 4),
                        resources=billed if i % 2 else [])
           for i, (b, j) in enumerate(placements)]
    out = bunches(sjs, max_attempts)
    assert all(1 <= len(bunch.attempts) <= max_attempts for bunch in out)
    per_batch = {b: [x for x in sjs if x.batch_id == b] for b in {x.batch_id for x in sjs}}
    for b, singles in per_batch.items():
        assert [x for bunch in out if bunch.batch_id == b for x in bunch.expand()] == singles
    # As few records as the cap allows: every bunch of a batch but its last one is full.
    assert len(out) == sum(-(-len(v) // max_attempts) for v in per_batch.values())
