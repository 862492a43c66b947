"""Execution events in the projector: SJ/MJS/MJC, lost attempts, cancellation, completion."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from schemas.batch import (
    BatchCancelled,
    JobGroupCancelled,
    JobGroupRecord,
    JobGroupsSubmitted,
    UpdateCommitted,
)
from schemas.envelope import wrap
from schemas.execution import (
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobStarted,
)
from services.common.settings import DatabaseSettings
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, job, query, snapshot, submission

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


@pytest.fixture
def sink(engine: sa.Engine, request: pytest.FixtureRequest) -> Sink:
    return Sink(engine, request.node.name)


def sj(b: int, j: int, a: str = "a1", cores: int = 1000) -> JobScheduled:
    return JobScheduled(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        inst_coll="standard", cores_mcpu=cores)


def mjs(b: int, j: int, a: str = "a1") -> JobStarted:
    return JobStarted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                      start_time_ms=T0 + 10)


def mjc(b: int, j: int, state: str = "Success", a: str = "a1") -> JobCompleted:
    return JobCompleted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        state=state, exit_code=0 if state == "Success" else 1,  # type: ignore[arg-type]
                        start_time_ms=T0 + 10, end_time_ms=T0 + 20)


def states(engine: sa.Engine, b: int) -> dict[int, str]:
    return dict(query(engine, "SELECT job_id, state FROM jobs WHERE batch_id = :b", b=b))


def user_row(engine: sa.Engine, user: str) -> dict[str, int]:
    cols = ("n_ready_jobs", "ready_cores_mcpu", "n_running_jobs", "running_cores_mcpu",
            "n_creating_jobs", "n_cancelled_ready_jobs", "n_cancelled_running_jobs")
    (row,) = query(engine, f"SELECT {', '.join(f'SUM({c})' for c in cols)} FROM "
                   "user_inst_coll_resources WHERE user = :u", u=user)
    return {c: int(v or 0) for c, v in zip(cols, row, strict=True)}


def counts(engine: sa.Engine, b: int, g: int = 0) -> dict[str, int]:
    cols = ("n_jobs", "n_pending", "n_ready", "n_running", "n_completed", "n_succeeded",
            "n_failed", "n_cancelled")
    (row,) = query(engine, f"SELECT {', '.join(cols)} FROM job_group_job_counts WHERE "
                   "batch_id = :b AND job_group_id = :g", b=b, g=g)
    return dict(zip(cols, (int(v) for v in row), strict=True))


def test_schedule_start_complete_release_and_finish(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(1, 1, [job(1), job(2, 0, [1]), job(3, 0, [1, 2])],
                                    create=True, user="u1")))
    sink.apply(s.records([sj(1, 1)]))
    assert states(engine, 1)[1] == "Running"
    assert user_row(engine, "u1")["n_running_jobs"] == 1
    assert user_row(engine, "u1")["running_cores_mcpu"] == 1000
    assert user_row(engine, "u1")["n_ready_jobs"] == 0
    assert counts(engine, 1)["n_running"] == 1 and counts(engine, 1)["n_ready"] == 0
    # A duplicate SJ and the MJS change nothing but the start time.
    before = user_row(engine, "u1")
    sink.apply(s.records([sj(1, 1), mjs(1, 1)]))
    assert user_row(engine, "u1") == before
    assert query(engine, "SELECT start_time_ms, n_attempts FROM jobs WHERE batch_id=1 AND "
                 "job_id=1") == [(T0 + 10, 1)]
    sink.apply(s.records([mjc(1, 1)]))
    assert states(engine, 1) == {1: "Success", 2: "Ready", 3: "Pending"}
    assert query(engine, "SELECT n_pending_parents FROM jobs WHERE batch_id=1 AND job_id=3"
                 ) == [(1,)]
    sink.apply(s.records([mjs(1, 2, "b"), sj(1, 2, "b"), mjc(1, 2, a="b")]))  # MJS first
    sink.apply(s.records([sj(1, 3, "c"), mjc(1, 3, a="c")]))
    assert states(engine, 1) == {1: "Success", 2: "Success", 3: "Success"}
    assert counts(engine, 1)["n_succeeded"] == 3 and counts(engine, 1)["n_completed"] == 3
    assert query(engine, "SELECT state, time_completed_ms IS NOT NULL FROM batches WHERE id=1"
                 ) == [("complete", 1)]
    assert all(v == 0 for v in user_row(engine, "u1").values())
    # A late duplicate MJC changes nothing.
    before_snap = snapshot(engine)
    sink.apply(s.records([mjc(1, 3, "Failed", a="c")]))
    assert snapshot(engine) == before_snap


def test_failed_parent_cancels_children_unless_always_run(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(2, 1, [job(1), job(2, 0, [1]), job(3, 0, [1],
                                                                     always_run=True)],
                                    create=True, user="u2")))
    sink.apply(s.records([sj(2, 1), mjc(2, 1, "Failed")]))
    assert states(engine, 2) == {1: "Failed", 2: "Ready", 3: "Ready"}
    assert dict(query(engine, "SELECT job_id, cancelled FROM jobs WHERE batch_id=2")) == {
        1: 0, 2: 1, 3: 0}
    assert user_row(engine, "u2")["n_cancelled_ready_jobs"] == 1
    assert user_row(engine, "u2")["n_ready_jobs"] == 1
    sink.apply(s.records([JobCancelled(batch_id=2, job_id=2, reason="parent_failed"),
                          sj(2, 3, "x"), mjc(2, 3, a="x")]))
    assert states(engine, 2) == {1: "Failed", 2: "Cancelled", 3: "Success"}
    assert counts(engine, 2)["n_failed"] == 1 and counts(engine, 2)["n_cancelled"] == 1
    assert all(v == 0 for v in user_row(engine, "u2").values())


def test_lost_attempts_retry_until_n_max_attempts(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    record = job(1)
    record = type(record)(**{**{f: getattr(record, f) for f in record.__struct_fields__},
                             "n_max_attempts": 2})
    sink.apply(s.records(submission(3, 1, [record], create=True, user="u3")))
    lost = AttemptLost(batch_id=3, job_id=1, attempt_id="a1", instance_name="w1",
                       reason="preempted", end_time_ms=T0 + 5)
    sink.apply(s.records([sj(3, 1), lost]))
    assert states(engine, 3) == {1: "Ready"} and user_row(engine, "u3")["n_ready_jobs"] == 1
    sink.apply(s.records([sj(3, 1, "a2"), AttemptLost(
        batch_id=3, job_id=1, attempt_id="a2", instance_name="w1", reason="instance_lost",
        end_time_ms=T0 + 9)]))
    assert states(engine, 3) == {1: "Error"}
    assert counts(engine, 3)["n_failed"] == 1
    assert query(engine, "SELECT COUNT(*) FROM attempts WHERE batch_id=3") == [(2,)]
    assert all(v == 0 for v in user_row(engine, "u3").values())


def _random_execution(seed: int) -> list[Any]:
    """A batch with groups and a DAG, run in a random legal order with failures, losses and
    a group cancellation; every job ends (the canceller cancels what is left)."""
    rng = random.Random(seed)
    groups = [JobGroupRecord(job_group_id=1, parent_id=0), JobGroupRecord(job_group_id=2,
                                                                          parent_id=1)]
    jobs = [job(i, rng.choice([0, 1, 2]),
                sorted(rng.sample(range(1, i), k=min(i - 1, rng.choice([0, 0, 1, 2])))),
                always_run=rng.random() < 0.2, cores=rng.choice([250, 1000, 2000]))
            for i in range(1, 31)]
    events: list[Any] = submission(9, 1, jobs, groups, create=True, user="r")
    parents = {j.job_id: set(j.parent_ids) for j in jobs}
    done: set[int] = set()
    running: dict[int, str] = {}
    cancelled_group = False
    while len(done) < len(jobs):
        ready = [j for j in parents if j not in done and j not in running
                 and parents[j] <= done]
        choice = rng.random()
        if not cancelled_group and len(done) > 10:
            events.append(JobGroupCancelled(batch_id=9, job_group_id=1))
            cancelled_group = True
        elif ready and (choice < 0.5 or not running):
            j = rng.choice(ready)
            a = f"a{j}-{rng.randrange(10**6)}"
            running[j] = a
            events += [sj(9, j, a)] if rng.random() < 0.5 else [mjs(9, j, a), sj(9, j, a)]
        elif running:
            j = rng.choice(sorted(running))
            a = running.pop(j)
            r = rng.random()
            if r < 0.15:
                events.append(AttemptLost(batch_id=9, job_id=j, attempt_id=a,
                                          instance_name="w1", reason="preempted",
                                          end_time_ms=T0))
            else:
                events.append(mjc(9, j, "Success" if r < 0.8 else "Failed", a))
                done.add(j)
        else:
            j = rng.choice(ready)
            events.append(JobCancelled(batch_id=9, job_id=j, reason="user"))
            done.add(j)
    return events


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counters_return_to_zero_and_batching_does_not_matter(
        db_server: DatabaseSettings, seed: int) -> None:
    from .projection_helpers import fresh_engines

    records = Stream().records(_random_execution(seed))
    snaps = []
    for (engine, name), chunk in zip(fresh_engines(db_server, 2), (1, 17), strict=True):
        try:
            sink = Sink(engine, "p")
            for i in range(0, len(records), chunk):
                sink.apply(records[i:i + chunk])
            snaps.append(snapshot(engine))
            assert all(v == 0 for v in user_row(engine, "r").values()), user_row(engine, "r")
            (left,) = query(engine, "SELECT COALESCE(SUM(n_ready_cancellable_jobs + "
                            "n_running_cancellable_jobs), 0) FROM "
                            "job_group_inst_coll_cancellable_resources")
            assert int(left[0]) == 0
            c = counts(engine, 9)
            assert c["n_completed"] == c["n_jobs"] == 30
            assert c["n_pending"] == c["n_ready"] == c["n_running"] == 0
            assert query(engine, "SELECT state FROM batches WHERE id = 9") == [("complete",)]
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
            engine.dispose()
    assert snaps[0] == snaps[1]


def test_batch_cancel_then_drain(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(5, 1, [job(1), job(2), job(3, always_run=True)],
                                    create=True, user="u5")))
    sink.apply(s.records([sj(5, 1), BatchCancelled(batch_id=5)]))
    row = user_row(engine, "u5")
    assert row["n_ready_jobs"] == 1 and row["n_cancelled_ready_jobs"] == 1
    assert row["n_running_jobs"] == 0 and row["n_cancelled_running_jobs"] == 1
    sink.apply(s.records([mjc(5, 1, "Cancelled"), JobCancelled(batch_id=5, job_id=2,
                                                               reason="user"),
                          sj(5, 3, "z"), mjc(5, 3, a="z")]))
    assert states(engine, 5) == {1: "Cancelled", 2: "Cancelled", 3: "Success"}
    assert all(v == 0 for v in user_row(engine, "u5").values())
    assert query(engine, "SELECT state FROM batches WHERE id = 5") == [("complete",)]


def test_a_commit_resolves_parents_of_earlier_updates(engine: sa.Engine, sink: Sink) -> None:
    """Update 2's jobs start from what update 1's jobs are at its commit: a parent that ended
    between the bunch and the commit counts as ended then, and one still running releases its
    children when it ends, like any parent."""
    s = Stream()
    sink.apply(s.records(submission(50, 1, [job(1), job(2), job(3)], create=True, user="u50")))
    sink.apply(s.records([sj(50, 1), mjc(50, 1), sj(50, 2), mjc(50, 2, "Failed"), sj(50, 3)]))
    update2 = submission(50, 2, [job(4, 0, [1]), job(5, 0, [2]), job(6, 0, [3]),
                                job(7, 0, [1, 3]), job(8, 0, [2], always_run=True),
                                job(9, 0, [1, 4])], start_job_id=4, commit=False)
    sink.apply(s.records(update2))
    # Not committed: invisible to the execution path and to the counters.
    assert counts(engine, 50)["n_jobs"] == 3
    sink.apply(s.records([UpdateCommitted(batch_id=50, update_id=2, n_jobs=6, n_job_groups=0)]))
    rows = {j: (st, p, c) for j, st, p, c in query(
        engine, "SELECT job_id, state, n_pending_parents, cancelled FROM jobs WHERE batch_id=50 "
        "AND job_id > 3")}
    assert rows == {4: ("Ready", 0, 0), 5: ("Ready", 0, 1), 6: ("Pending", 1, 0),
                    7: ("Pending", 1, 0), 8: ("Ready", 0, 0), 9: ("Pending", 1, 0)}
    assert counts(engine, 50) == {"n_jobs": 9, "n_pending": 3, "n_ready": 3, "n_running": 1,
                         "n_completed": 2, "n_succeeded": 1, "n_failed": 1, "n_cancelled": 0}
    assert user_row(engine, "u50") == {
        "n_ready_jobs": 2, "ready_cores_mcpu": 2000, "n_running_jobs": 1,
        "running_cores_mcpu": 1000, "n_creating_jobs": 0, "n_cancelled_ready_jobs": 1,
        "n_cancelled_running_jobs": 0}
    # Job 3 ends: 6 and 7 become Ready; 9 still waits for 4.
    sink.apply(s.records([mjc(50, 3)]))
    assert {j: st for j, st in states(engine, 50).items() if j > 3} == {
        4: "Ready", 5: "Ready", 6: "Ready", 7: "Ready", 8: "Ready", 9: "Pending"}
    assert user_row(engine, "u50")["n_ready_jobs"] == 4
    # A commit delivered again changes nothing.
    before = snapshot(engine)
    sink.apply(s.records([UpdateCommitted(batch_id=50, update_id=2, n_jobs=6, n_job_groups=0)]))
    assert snapshot(engine) == before


def test_a_failed_transaction_leaves_nothing_cached(engine: sa.Engine, sink: Sink) -> None:
    """What a transaction folded into the partition's cache is dropped when it rolls back: the
    same SJ applied again is a first SJ, not a duplicate of one the database never saw."""
    s = Stream()
    sink.apply(s.records(submission(60, 1, [job(1), job(2)], create=True, user="u60")))
    sink.apply(s.records([sj(60, 1)]))
    # Another batch's groups naming a parent that does not exist: the fold fails after SJ(2).
    bad = JobGroupsSubmitted(batch_id=61, update_id=1, job_groups=[
        JobGroupRecord(job_group_id=5, parent_id=4)])
    failing = s.records([sj(60, 2, "b"), bad])
    with pytest.raises(LookupError):
        sink.apply(failing)
    assert states(engine, 60) == {1: "Running", 2: "Ready"}
    sink.apply(failing[:1])
    assert states(engine, 60) == {1: "Running", 2: "Running"}
    assert user_row(engine, "u60")["n_running_jobs"] == 2


def test_a_reassigned_partition_is_read_again(engine: sa.Engine, sink: Sink,
                                               request: pytest.FixtureRequest) -> None:
    """Partitions assigned anew may have been written by another instance meanwhile: after
    forget() the sink reads them back instead of trusting what it cached."""
    s = Stream()
    sink.apply(s.records(submission(62, 1, [job(1), job(2, 0, [1])], create=True,
                                    user="u62")))
    sink.apply(s.records([sj(62, 1)]))  # job 1 Running, cached here
    other = Sink(engine, request.node.name)  # the same consumer, as another instance
    other.apply(s.records([mjc(62, 1)]))
    assert states(engine, 62) == {1: "Success", 2: "Ready"}
    sink.forget()
    # A duplicate MJC (a worker's retry) is a duplicate only to a sink that reads job 1 again.
    sink.apply(s.records([mjc(62, 1), sj(62, 2, "b"), mjc(62, 2, a="b")]))
    assert states(engine, 62) == {1: "Success", 2: "Success"}
    assert counts(engine, 62)["n_succeeded"] == 2
    assert all(v == 0 for v in user_row(engine, "u62").values())


def test_the_cache_forgets_least_recently_used_batches_beyond_its_bound() -> None:
    from services.projector.state import PartitionCache

    cache = PartitionCache()
    for b, n in ((1, 3), (2, 3), (3, 3)):
        cache.get(b).jobs.update({j: None for j in range(n)})
    cache.get(1)  # now the most recently used
    cache.trim(6)
    assert len(cache) == 2 and cache.get(2).jobs == {} and len(cache.get(1).jobs) == 3
    big = PartitionCache()
    big.get(7).jobs.update({j: None for j in range(10)})
    big.trim(4)  # the one batch in use is kept whatever its size
    assert len(big.get(7).jobs) == 10


def test_forget_leaves_other_partitions_to_their_own_transactions(engine: sa.Engine,
                                                                   sink: Sink) -> None:
    """Each topic applies in its own thread: forget() must not let one partition's transaction
    clear the cache another partition's transaction may be using; each is dropped by its own."""
    s0, s1 = Stream(partition=0), Stream(partition=1)
    sink.apply(s0.records(submission(63, 1, [job(1), job(2)], create=True, user="u63")))
    sink.apply(s1.records(submission(64, 1, [job(1), job(2)], create=True, user="u64")))
    sink.apply(s0.records([sj(63, 1)]))
    sink.apply(s1.records([sj(64, 1)]))
    other = sink._caches[("batch-events", 1)]
    assert len(other) == 1
    sink.forget()
    sink.apply(s0.records([sj(63, 2, "b")]))
    assert len(other) == 1  # partition 1's cache is untouched by partition 0's transaction
    sink.apply(s1.records([mjc(64, 1)]))
    assert states(engine, 64) == {1: "Success", 2: "Ready"}
    assert states(engine, 63) == {1: "Running", 2: "Running"}


def test_a_bunch_of_cancellations_projects_as_its_single_ones(
        db_server: DatabaseSettings) -> None:
    """One ``jobs.cancelled`` record leaves the projection exactly as its single
    ``job.cancelled`` records would: rows, counters, releases, completion, event rates."""
    from .projection_helpers import fresh_engines

    jobs = [job(1), job(2), job(3, parents=[1]), job(4, always_run=True), job(5)]
    base = [*submission(6, 1, jobs, create=True, user="u6"), sj(6, 5), mjc(6, 5),
            BatchCancelled(batch_id=6)]
    ids = [1, 2, 5, 77]  # 5 succeeded already and 77 is unknown: both left alone
    at = T0 + 1_000  # the same time for both, so that the end times and rates agree
    singles = [wrap(JobCancelled(batch_id=6, job_id=j, reason="user"),
                    event_id=f"s{j}", time_ms=at) for j in ids]
    bunch = [wrap(JobsCancelled(batch_id=6, job_ids=ids, reason="user"), event_id="b",
                  time_ms=at)]
    snaps = []
    for (engine, name), drain in zip(fresh_engines(db_server, 2), (singles, bunch),
                                     strict=True):
        try:
            Sink(engine, "p").apply(Stream().records([*base, *drain]))
            assert states(engine, 6) == {1: "Cancelled", 2: "Cancelled", 3: "Ready",
                                         4: "Ready", 5: "Success"}
            # As the single events do, the rates count every cancellation the canceller sent.
            assert query(engine, "SELECT SUM(n) FROM event_rates WHERE kind = 'cancelled'"
                         ) == [(4,)]
            snaps.append(snapshot(engine))
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
            engine.dispose()
    assert snaps[0] == snaps[1]
