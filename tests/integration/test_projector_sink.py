"""The projector's sink on real MariaDB: submission, commit, DAG, cancellation, exactly-once."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from schemas.batch import (
    BatchCancelled,
    BatchCreated,
    JobGroupCancelled,
    JobGroupRecord,
    JobsSubmitted,
    UpdateCommitted,
)
from schemas.control import (
    BillingLimitSet,
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from services.common.settings import DatabaseSettings
from services.projector.sink import Sink

from .projection_helpers import Stream, fresh_engines, job, query, snapshot, submission

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


@pytest.fixture
def sink(engine: sa.Engine, request: pytest.FixtureRequest) -> Sink:
    """A sink whose stored offsets belong to this test alone (the database is per module)."""
    return Sink(engine, request.node.name)


def counts(engine: sa.Engine, batch_id: int, group: int) -> dict[str, int]:
    (row,) = query(engine, "SELECT n_jobs, n_pending, n_ready, n_completed FROM "
                   "job_group_job_counts WHERE batch_id = :b AND job_group_id = :g",
                   b=batch_id, g=group)
    return dict(zip(("n_jobs", "n_pending", "n_ready", "n_completed"), row, strict=True))


def ready(engine: sa.Engine, user: str) -> tuple[int, int, int]:
    (row,) = query(engine, "SELECT SUM(n_ready_jobs), SUM(ready_cores_mcpu), "
                   "SUM(n_cancelled_ready_jobs) FROM user_inst_coll_resources WHERE user = :u",
                   u=user)
    return tuple(int(v or 0) for v in row)  # type: ignore[return-value]


def test_control_events(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream("control-events")
    sink.apply(s.records([
        UserCreated(user="bob", is_developer=True),
        TokenIssued(user="bob", token_id="t1", token_sha256="a" * 64),
        BillingProjectCreated(billing_project="lab"),
        BillingProjectMemberAdded(billing_project="lab", user="bob"),
        BillingLimitSet(billing_project="lab", limit=__import__("decimal").Decimal("12.5")),
    ]))
    assert query(engine, "SELECT name, is_developer FROM users WHERE name='bob'") == [("bob", 1)]
    assert query(engine, "SELECT user FROM auth_tokens WHERE token_hash = :h", h="a" * 64) == [
        ("bob",)]
    assert query(engine, "SELECT status, limit_usd FROM billing_projects WHERE name='lab'")[0][
        0] == "open"
    assert float(query(engine, "SELECT limit_usd FROM billing_projects WHERE name='lab'")[0][0]
                 ) == 12.5
    assert query(engine, "SELECT user FROM billing_project_users WHERE billing_project='lab'"
                 ) == [("bob",)]


def test_submission_commit_dag_and_groups(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    groups = [JobGroupRecord(job_group_id=1, parent_id=0),
              JobGroupRecord(job_group_id=2, parent_id=1, attributes={"name": "inner"})]
    jobs = [job(1, 1, name="a"), job(2, 2, [1]), job(3, 0, cores=2000)]
    applied = sink.apply(s.records(submission(10, 1, jobs, groups, create=True)))
    assert applied.fresh == 5 and applied.skipped_tags == 0

    states = dict(query(engine, "SELECT job_id, state FROM jobs WHERE batch_id = 10"))
    assert states == {1: "Ready", 2: "Pending", 3: "Ready"}
    assert query(engine, "SELECT n_pending_parents FROM jobs WHERE batch_id=10 AND job_id=2"
                 ) == [(1,)]
    assert counts(engine, 10, 0) == {"n_jobs": 3, "n_pending": 1, "n_ready": 2, "n_completed": 0}
    assert counts(engine, 10, 1) == {"n_jobs": 2, "n_pending": 1, "n_ready": 1, "n_completed": 0}
    assert counts(engine, 10, 2) == {"n_jobs": 1, "n_pending": 1, "n_ready": 0, "n_completed": 0}
    assert ready(engine, "alice") == (2, 3000, 0)
    assert query(engine, "SELECT state, n_jobs FROM batches WHERE id = 10") == [("running", 3)]
    assert query(engine, "SELECT ancestor_id, level FROM job_group_self_and_ancestors WHERE "
                 "batch_id = 10 AND job_group_id = 2 ORDER BY level") == [(2, 0), (1, 1), (0, 2)]
    assert query(engine, "SELECT committed, depth FROM job_groups WHERE batch_id=10 "
                 "ORDER BY job_group_id") == [(1, 0), (1, 1), (1, 2)]

    # A second update depends on a job of the first: Pending, since job 1 is only Ready.
    sink.apply(s.records(submission(10, 2, [job(4, 0, [1]), job(5, 0)], start_job_id=4)))
    states = dict(query(engine, "SELECT job_id, state FROM jobs WHERE batch_id = 10"))
    assert states[4] == "Pending" and states[5] == "Ready"
    assert counts(engine, 10, 0)["n_jobs"] == 5
    assert ready(engine, "alice") == (3, 4000, 0)


def test_resubmitted_bunch_and_duplicate_commit_change_nothing(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    events = submission(11, 1, [job(1), job(2, 0, [1])], create=True)
    sink.apply(s.records(events))
    before = snapshot(engine)
    # The same events again, at new offsets (a client retry): all idempotent.
    sink.apply(s.records(events[1:]))
    assert snapshot(engine) == before


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "read-back"])
def test_a_bunch_resent_before_the_commit_counts_once(
        engine: sa.Engine, sink: Sink, request: pytest.FixtureRequest, cached: bool) -> None:
    """Jobs of an open update are known from the sink's cache when it saw the update opened,
    and read back otherwise (a new sink: a restart); both count a resent job once."""
    b = 20 if cached else 21
    s = Stream(partition=b)

    def apply(events: list[object]) -> None:
        (sink if cached else Sink(engine, request.node.name)).apply(
            s.records(events))  # type: ignore[arg-type]

    created, opened = submission(b, 1, [job(1), job(2), job(3)], create=True, commit=False)[:2]
    apply([created, opened, JobsSubmitted(batch_id=b, update_id=1, jobs=[job(1), job(2)])])
    apply([JobsSubmitted(batch_id=b, update_id=1, jobs=[job(2), job(3)]),  # 2 again
           JobsSubmitted(batch_id=b, update_id=1, jobs=[job(1)])])  # and 1, in one go
    (staged,) = query(engine, "SELECT SUM(n_jobs) FROM batch_update_job_counts "
                      "WHERE batch_id = :b", b=b)
    assert int(staged[0]) == 3
    apply([UpdateCommitted(batch_id=b, update_id=1, n_jobs=3, n_job_groups=0)])
    assert counts(engine, b, 0)["n_jobs"] == 3
    assert query(engine, "SELECT job_id FROM jobs WHERE batch_id = :b ORDER BY job_id",
                 b=b) == [(1,), (2,), (3,)]


def test_empty_batch_is_complete_at_commit(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(12, 1, [], create=True)))
    assert query(engine, "SELECT state, n_jobs, time_completed_ms IS NOT NULL FROM batches "
                 "WHERE id = 12") == [("complete", 0, 1)]
    assert query(engine, "SELECT state FROM job_groups WHERE batch_id=12 AND job_group_id=0"
                 ) == [("complete",)]


def test_cancel_group_cancels_descendants_in_o1_counters(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    groups = [JobGroupRecord(job_group_id=1, parent_id=0),
              JobGroupRecord(job_group_id=2, parent_id=1),
              JobGroupRecord(job_group_id=3, parent_id=0)]
    jobs = [job(1, 1), job(2, 2), job(3, 3), job(4, 2, always_run=True)]
    sink.apply(s.records(submission(13, 1, jobs, groups, create=True, user="carol")))
    assert ready(engine, "carol") == (4, 4000, 0)
    sink.apply(s.records([JobGroupCancelled(batch_id=13, job_group_id=1)]))
    assert query(engine, "SELECT job_group_id FROM job_groups_cancelled WHERE batch_id=13 "
                 "ORDER BY job_group_id") == [(1,), (2,)]
    # Jobs 1 and 2 left fair share at once; always_run job 4 and job 3 (group 3) stay.
    assert ready(engine, "carol") == (2, 2000, 2)
    # Cancelling again, or cancelling a descendant, changes nothing.
    before = snapshot(engine)
    sink.apply(s.records([JobGroupCancelled(batch_id=13, job_group_id=1),
                          JobGroupCancelled(batch_id=13, job_group_id=2)]))
    assert snapshot(engine) == before
    sink.apply(s.records([BatchCancelled(batch_id=13)]))
    assert ready(engine, "carol") == (1, 1000, 3)
    assert query(engine, "SELECT batch_id FROM batches_cancelled") == [(13,)]


def test_jobs_committed_into_a_cancelled_group_are_cancelled(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    groups = [JobGroupRecord(job_group_id=1, parent_id=0)]
    sink.apply(s.records(submission(14, 1, [job(1, 1)], groups, create=True, user="dave")))
    sink.apply(s.records([JobGroupCancelled(batch_id=14, job_group_id=1)]))
    sink.apply(s.records(submission(14, 2, [job(2, 1), job(3, 1, always_run=True)],
                                    start_job_id=2, start_group_id=2)))
    # Their group's cancellation says so (no per-job flag: that would be O(jobs) per commit);
    # they count as cancelled at once, except the always_run one.
    assert dict(query(engine, "SELECT job_id, cancelled FROM jobs WHERE batch_id = 14")) == {
        1: 0, 2: 0, 3: 0}
    assert ready(engine, "dave") == (1, 1000, 2)


def _workload() -> list:  # type: ignore[type-arg]
    events = [BatchCreated(batch_id=20, user="erin", billing_project="proj", token="t")]
    events += submission(20, 1, [job(i, i % 3, [i - 1] if i % 4 == 0 else [])
                                 for i in range(1, 40)],
                         [JobGroupRecord(job_group_id=1, parent_id=0),
                          JobGroupRecord(job_group_id=2, parent_id=1)])
    events += submission(20, 2, [job(40, 2, [3, 39]), job(41, 0)], start_job_id=40,
                         start_group_id=3)
    events.append(JobGroupCancelled(batch_id=20, job_group_id=2))
    events += submission(21, 1, [job(1), job(2, 0, [1])], create=True, user="frank")
    events.append(BatchCancelled(batch_id=21))
    return events


def test_projection_does_not_depend_on_batching(db_server: DatabaseSettings) -> None:
    """Applying the same records one by one, all at once, or in random chunks, and applying
    them twice, gives byte-identical projections (and replay of the log rebuilds them)."""
    records = Stream().records(_workload())
    rng = random.Random(7)
    splits = [[1] * len(records), [len(records)]]
    cuts = sorted(rng.sample(range(1, len(records)), 6))
    splits.append([b - a for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True)])
    snapshots = []
    for (engine, name), sizes in zip(fresh_engines(db_server, len(splits)), splits, strict=True):
        try:
            sink, i = Sink(engine, "p"), 0
            for n in sizes:
                sink.apply(records[i:i + n])
                i += n
            assert sink.apply(records).fresh == 0  # everything was applied exactly once
            snapshots.append(snapshot(engine))
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{name}`"))
            engine.dispose()
    assert snapshots[0] == snapshots[1] == snapshots[2]
    assert snapshots[0]["jobs"], "the workload produced jobs"


async def test_apply_with_retry_survives_an_unreachable_database(
        engine: sa.Engine, migrated_db: DatabaseSettings) -> None:
    """A sink whose database refuses connections at first is retried until it answers."""
    from services.projector.app import apply_with_retry

    s = Stream()
    records = s.records(submission(30, 1, [job(1)], create=True))
    broken = sa.create_engine(migrated_db.url().replace(f":{migrated_db.port}/", ":1/"))
    sink = Sink(broken, "retry")
    calls = 0
    real = Sink(engine, "retry")

    def flaky(recs: list, *, lagging: bool = True) -> object:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        return (sink if calls < 3 else real).apply(recs, lagging=lagging)

    class Flaky:
        apply = staticmethod(flaky)

    applied = await apply_with_retry(Flaky(), records, first_delay_s=0.01)  # type: ignore[arg-type]
    broken.dispose()
    assert calls == 3 and applied.fresh == len(records)
    assert query(engine, "SELECT state FROM batches WHERE id = 30") == [("running",)]
