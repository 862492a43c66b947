"""The projector writes a completion's outbox row in the same transaction as the completion."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from schemas.batch import BatchCancelled, BatchCreated, JobGroupRecord
from schemas.execution import JobCancelled, JobCompleted, JobScheduled
from services.common.settings import DatabaseSettings
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, fresh_engines, job, query, submission

pytestmark = pytest.mark.integration

OUTBOX_SQL = ("SELECT job_group_id, n_jobs, outcome, n_succeeded, n_failed, n_cancelled, "
              "time_completed_ms, published_ms FROM completions_outbox WHERE batch_id = :b "
              "ORDER BY job_group_id, n_jobs")


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


@pytest.fixture
def sink(engine: sa.Engine, request: pytest.FixtureRequest) -> Sink:
    return Sink(engine, request.node.name)


def run(b: int, j: int, state: str = "Success") -> list[Any]:
    return [JobScheduled(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name="w1",
                         inst_coll="standard", cores_mcpu=1000),
            JobCompleted(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name="w1",
                         state=state, exit_code=0 if state == "Success" else 1,  # type: ignore[arg-type]
                         start_time_ms=T0, end_time_ms=T0 + 1)]


def outbox(engine: sa.Engine, b: int) -> list[tuple[Any, ...]]:
    return query(engine, OUTBOX_SQL, b=b)


def test_groups_and_batch_complete_with_their_counts(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    groups = [JobGroupRecord(job_group_id=1, parent_id=0),
              JobGroupRecord(job_group_id=2, parent_id=1)]
    sink.apply(s.records(submission(1, 1, [job(1, 0), job(2, 1), job(3, 2)], groups,
                                    create=True)))
    assert outbox(engine, 1) == []
    records = s.records(run(1, 3) + run(1, 2, "Failed"))
    sink.apply(records)
    t2, t4 = records[1].envelope.time_ms, records[3].envelope.time_ms
    assert outbox(engine, 1) == [(1, 2, "failure", 1, 1, 0, t4, None),
                                 (2, 1, "success", 1, 0, 0, t2, None)]
    records = s.records(run(1, 1))
    sink.apply(records)
    assert outbox(engine, 1)[0] == (0, 3, "failure", 2, 1, 0, records[1].envelope.time_ms, None)
    sink.apply(s.records(run(1, 1)))  # a duplicate MJC completes nothing again
    assert len(outbox(engine, 1)) == 3


def test_a_reopened_batch_completes_again_with_more_jobs(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(2, 1, [job(1)], create=True) + run(2, 1)))
    assert [r[:2] for r in outbox(engine, 2)] == [(0, 1)]
    sink.apply(s.records(submission(2, 2, [], start_job_id=2)))  # no jobs: still complete
    assert [r[:2] for r in outbox(engine, 2)] == [(0, 1)]
    sink.apply(s.records(submission(2, 3, [job(2)], start_job_id=2)))
    assert [r[:2] for r in outbox(engine, 2)] == [(0, 1)]
    sink.apply(s.records(run(2, 2, "Failed")))
    assert [r[:3] for r in outbox(engine, 2)] == [(0, 1, "success"), (0, 2, "failure")]


def test_commits_that_leave_nothing_to_run_complete_at_once(engine: sa.Engine,
                                                            sink: Sink) -> None:
    s = Stream()
    records = s.records(submission(3, 1, [], [JobGroupRecord(job_group_id=1, parent_id=0)],
                                   create=True))
    sink.apply(records)
    t = records[-1].envelope.time_ms
    assert outbox(engine, 3) == [(0, 0, "success", 0, 0, 0, t, None),
                                 (1, 0, "success", 0, 0, 0, t, None)]


def test_a_batch_created_empty_is_complete_at_once_and_reopens(engine: sa.Engine,
                                                               sink: Sink) -> None:
    """POST /batches/create with no jobs opens no update: the batch is complete (success) at
    once, with its completion; an update later makes it run and complete again."""
    s = Stream()
    records = s.records([BatchCreated(batch_id=5, user="alice", billing_project="proj",
                                      token="tok-5", empty=True)])
    sink.apply(records)
    t = records[0].envelope.time_ms
    assert query(engine, "SELECT state, time_closed_ms, time_completed_ms FROM batches "
                 "WHERE id = 5") == [("complete", t, t)]
    assert outbox(engine, 5) == [(0, 0, "success", 0, 0, 0, t, None)]
    sink.apply(s.records(submission(5, 1, [job(1)])))
    assert query(engine, "SELECT state, time_completed_ms FROM batches WHERE id = 5"
                 ) == [("running", None)]
    sink.apply(s.records(run(5, 1)))
    assert query(engine, "SELECT state FROM batches WHERE id = 5") == [("complete",)]
    assert [r[:3] for r in outbox(engine, 5)] == [(0, 0, "success"), (0, 1, "success")]


def test_a_cancelled_batch_completes_cancelled(engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(4, 1, [job(1), job(2, 0, [1])], create=True)))
    sink.apply(s.records([BatchCancelled(batch_id=4),
                          JobCancelled(batch_id=4, job_id=1, reason="user"),
                          JobCancelled(batch_id=4, job_id=2, reason="user")]))
    assert [r[:6] for r in outbox(engine, 4)] == [(0, 2, "cancelled", 0, 0, 2)]


def test_replay_writes_the_same_outbox_whatever_the_batching(
        db_server: DatabaseSettings) -> None:
    groups = [JobGroupRecord(job_group_id=1, parent_id=0)]
    events = (submission(5, 1, [job(1, 1), job(2, 0, [1]), job(3, 1)], groups, create=True)
              + run(5, 1) + run(5, 3, "Failed")
              + [JobCancelled(batch_id=5, job_id=2, reason="user")]
              + submission(5, 2, [job(4)], start_job_id=4, start_group_id=2) + run(5, 4))
    records = Stream().records(events)
    tables = []
    for (engine, _), chunk in zip(fresh_engines(db_server, 2), (1, 100), strict=True):
        try:
            sink = Sink(engine, "p")
            for i in range(0, len(records), chunk):
                sink.apply(records[i:i + chunk])
            tables.append(query(engine, "SELECT * FROM completions_outbox "
                                        "ORDER BY batch_id, job_group_id, n_jobs"))
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE `{engine.url.database}`"))
            engine.dispose()
    assert tables[0] == tables[1]
    assert [r[1:4] for r in tables[0]] == [(0, 3, "failure"), (0, 4, "failure"),
                                          (1, 2, "failure")]
