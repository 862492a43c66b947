"""Waiting reasons in the projector and in job reads: ``scheduler.waiting_reasons`` events."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from schemas.batch import BatchCancelled
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    WaitingReason,
    WaitingReasonsChanged,
)
from schemas.execution import JobScheduled
from services.common.settings import DatabaseSettings
from services.ingest.reads import Reads
from services.ingest.store import Store
from services.projector.sink import Sink

from .projection_helpers import Stream, fresh_engines, job, snapshot, submission

pytestmark = pytest.mark.integration

TABLES = ("user_waiting_reasons", "job_waiting_reasons", "waiting_reasons_epoch")


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    with engine.begin() as conn:  # the module's database is shared: start from no reasons
        for table in TABLES:
            conn.execute(sa.text(f"DELETE FROM {table}"))
    yield engine
    engine.dispose()


_batch_ids = itertools.count(1)


@pytest.fixture
def b() -> int:
    """A batch id of its own for each test (the module's database is shared)."""
    return next(_batch_ids)


def entry(user: str = "alice", reason: str | None = "fair_share", *, job_id: int | None = None,
          message: str = "m", since: int | None = 5, b: int = 0) -> WaitingReason:
    return WaitingReason(user=user, inst_coll="standard", reason=reason,
                         batch_id=None if job_id is None else b, job_id=job_id,
                         message=message if reason else "", since_ms=since if reason else None)


member = [BillingProjectCreated(billing_project="proj"),
          BillingProjectMemberAdded(billing_project="proj", user="alice")]
"""Reads show batches to members of their billing project."""


def changed(epoch: int, *entries: WaitingReason) -> WaitingReasonsChanged:
    return WaitingReasonsChanged(epoch=epoch, entries=list(entries))


class Project:
    """Applies batch events and control events (each its own partition) through one sink."""

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self.sink = Sink(engine, name)
        self.batch, self.control = Stream("batch-events"), Stream("control-events")
        self.applied: list[Any] = []

    def __call__(self, *events: Any) -> None:
        records = [*self.batch.records([e for e in events if e.topic == "batch-events"]),
                   *self.control.records([e for e in events if e.topic == "control-events"])]
        self.applied += records
        self.sink.apply(records)


def waiting(engine: sa.Engine, b: int, job_id: int) -> tuple[str, str, int | None] | None:
    w = Reads(Store(engine, "")).job(b, job_id, "alice")["waiting_reason"]
    return None if w is None else (w["reason"], w["message"], w["since_ms"])


def test_job_reads_show_the_jobs_reason_else_its_queues_and_clear_with_the_scheduler(
        engine: sa.Engine, request: pytest.FixtureRequest, b: int) -> None:
    project = Project(engine, request.node.name)
    project(*member, *submission(b, 1, [job(1), job(2), job(3)], create=True))
    assert waiting(engine, b, 1) is None  # the scheduler has said nothing yet
    project(changed(2, entry(), entry(reason="region", job_id=1, b=b, message="r", since=7)))
    assert waiting(engine, b, 1) == ("region", "r", 7)
    assert waiting(engine, b, 2) == ("fair_share", "m", 5)  # no entry of its own: the queue's
    project(changed(2, entry(job_id=1, b=b, reason=None), entry(message="m2", since=5)))
    assert waiting(engine, b, 1) == ("fair_share", "m2", 5)
    # a Running job is not waiting, whatever rows remain
    project(JobScheduled(batch_id=b, job_id=3, attempt_id="a", instance_name="w",
                         inst_coll="standard", cores_mcpu=1000))
    assert waiting(engine, b, 3) is None
    project(changed(2, entry(reason=None)))
    assert waiting(engine, b, 2) is None
    assert snapshot(engine, TABLES[:2]) == {"user_waiting_reasons": [],
                                            "job_waiting_reasons": []}


def test_stale_epochs_are_ignored_and_a_new_epoch_replaces_everything(
        engine: sa.Engine, request: pytest.FixtureRequest, b: int) -> None:
    project = Project(engine, request.node.name)
    project(*member, *submission(b, 1, [job(1), job(2)], create=True))
    project(changed(3, entry(), entry("bob", "quota"), entry(reason="no_fit", job_id=2, b=b)))
    # a deposed leader's event is ignored
    project(changed(2, entry(reason="region", job_id=1, b=b), entry("carol")))
    assert waiting(engine, b, 1) == ("fair_share", "m", 5)
    rows = snapshot(engine, TABLES)
    assert [r[:3] for r in rows["user_waiting_reasons"]] == [
        ("alice", "standard", "fair_share"), ("bob", "standard", "quota")]
    assert [r[:2] for r in rows["job_waiting_reasons"]] == [(b, 2)]
    assert [r[:2] for r in rows["waiting_reasons_epoch"]] == [("scheduler", 3)]
    # the next leader's first event, even empty, drops everything earlier leaders said
    project(changed(4))
    assert snapshot(engine, TABLES[:2]) == {"user_waiting_reasons": [],
                                            "job_waiting_reasons": []}
    project(changed(4, entry(reason="no_fit", message="n")))
    assert waiting(engine, b, 2) == ("no_fit", "n", 5)


def test_a_cancelled_job_waits_to_be_drained(engine: sa.Engine, request: pytest.FixtureRequest,
                                             b: int) -> None:
    project = Project(engine, request.node.name)
    project(*member, *submission(b, 1, [job(1), job(2, always_run=True)], create=True))
    project(changed(5, entry()))
    project(BatchCancelled(batch_id=b, reason="user"))
    w = Reads(Store(engine, "")).job(b, 1, "alice")["waiting_reason"]
    assert w["reason"] == "cancelled" and "(user)" in w["message"] and w["since"]
    assert waiting(engine, b, 2) == ("fair_share", "m", 5)  # always_run: still scheduled


def test_a_replay_rebuilds_the_same_rows(engine: sa.Engine, request: pytest.FixtureRequest,
                                         db_server: DatabaseSettings, b: int) -> None:
    project = Project(engine, request.node.name)
    project(*member, *submission(b, 1, [job(1), job(2)], create=True))
    project(changed(1, entry(), entry(reason="region", job_id=1, b=b)))
    project(changed(2, entry("bob")))
    project(changed(1, entry("carol")))
    project(changed(2, entry("bob", reason=None), entry(reason="no_fit", job_id=2, b=b)))
    live = snapshot(engine, TABLES)
    project.sink.apply(project.applied)  # redelivery changes nothing
    assert snapshot(engine, TABLES) == live
    ((other, name),) = fresh_engines(db_server, 1)
    try:
        Sink(other, "replay").apply(project.applied)
        assert snapshot(other, TABLES) == live
    finally:
        with other.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE `{name}`"))
        other.dispose()
