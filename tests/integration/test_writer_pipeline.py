"""The writer's statement pipeline: statements run in order on a thread of their own, a failure
skips the rest and is raised where the caller waits, and a sink whose fold fails midway leaves
nothing behind (its statements drained before the rollback)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from core.projection.ops import InsertIgnore
from schemas.batch import JobsSubmitted
from services.common.settings import DatabaseSettings
from services.projector import handlers
from services.projector.sink import Sink
from services.projector.writer import Pipeline, Writer

from .projection_helpers import Stream, job, query, submission

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


def attempt(b: int, j: int) -> InsertIgnore:
    return InsertIgnore("attempts", [{"batch_id": b, "job_id": j, "attempt_id": "a"}])


def test_statements_run_in_order_and_a_failure_skips_the_rest(engine: sa.Engine) -> None:
    pipeline = Pipeline()
    try:
        with engine.connect() as conn:
            writer = Writer(conn, pipeline)
            for j in range(1, 4):
                writer.emit([attempt(880_001, j)])
                writer.flush(wait=False)  # one statement each, none waited for
            writer.sync()
            assert conn.execute(sa.text("SELECT job_id FROM attempts WHERE batch_id = 880001 "
                                        "ORDER BY job_id")).all() == [(1,), (2,), (3,)]
            pipeline.submit(lambda: conn.exec_driver_sql("SELECT * FROM no_such_table"))
            writer.emit([attempt(880_002, 1)])
            writer.flush(wait=False)
            with pytest.raises(sa.exc.ProgrammingError, match="no_such_table"):
                writer.sync()
            # The insert after the failure never ran (not only rolled back: still in the txn).
            assert conn.execute(sa.text(
                "SELECT COUNT(*) FROM attempts WHERE batch_id = 880002")).scalar() == 0
            conn.rollback()
            # The pipeline works again after a failure.
            writer.emit([attempt(880_003, 1)])
            writer.flush()
            assert conn.execute(sa.text(
                "SELECT COUNT(*) FROM attempts WHERE batch_id = 880003")).scalar() == 1
            conn.rollback()
    finally:
        pipeline.close()


def test_a_fold_that_fails_midway_leaves_nothing_and_the_retry_applies_once(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = Sink(engine, "pipeline-failure")
    s = Stream(partition=3)
    events = submission(30, 1, [job(1), job(2), job(3)], create=True, commit=False)
    more = JobsSubmitted(batch_id=30, update_id=1, jobs=[job(3)])
    records = s.records([*events, more])

    def broken(self: handlers.Handler, event: JobsSubmitted) -> None:
        if len(event.jobs) == 1:
            raise RuntimeError("boom")  # after the first bunch's statements were sent
        original(self, event)

    original = handlers.Handler._jobs
    monkeypatch.setattr(handlers.Handler, "_jobs", broken)
    with pytest.raises(RuntimeError, match="boom"):
        sink.apply(records)
    assert query(engine, "SELECT COUNT(*) FROM jobs WHERE batch_id = 30") == [(0,)]
    assert query(engine, "SELECT COUNT(*) FROM batch_updates WHERE batch_id = 30") == [(0,)]
    monkeypatch.setattr(handlers.Handler, "_jobs", original)
    sink.apply(records)
    assert query(engine, "SELECT COUNT(*) FROM jobs WHERE batch_id = 30") == [(3,)]
    (staged,) = query(engine, "SELECT SUM(n_jobs) FROM batch_update_job_counts "
                      "WHERE batch_id = 30")
    assert int(staged[0]) == 3
