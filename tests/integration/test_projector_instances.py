"""The projector folds the scheduler topic's instance events into ``instances`` and counts
SJ/MJS/MJC/cancellations per minute into the tokenized ``event_rates``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from schemas.execution import JobCancelled, JobCompleted, JobScheduled, JobStarted
from schemas.infra import (
    InstanceActivated,
    InstanceCreated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceRequested,
    LogMarker,
    SchedulerElected,
)
from services.common.settings import DatabaseSettings
from services.ingest.ops import Ops
from services.ingest.store import Store
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, job, query, submission

pytestmark = pytest.mark.integration

MIN = 60_000
M0 = T0 // MIN  # T0 is on a minute's boundary


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    with engine.begin() as conn:
        for table in ("instances", "event_rates", "scheduler_epochs"):
            conn.execute(sa.text(f"DELETE FROM {table}"))
    yield engine
    engine.dispose()


def at(event: AnyEvent, time_ms: int, epoch: int = 0) -> Envelope:
    return wrap(event, event_id=uuid.uuid4().hex, time_ms=time_ms, producer_epoch=epoch)


def requested(name: str, cores: int = 4000) -> InstanceRequested:
    return InstanceRequested(instance_name=name, inst_coll="standard", machine_type="n1-4",
                             region="local", cores_mcpu=cores, preemptible=False,
                             for_batch_id=None)


def test_instance_events_fill_instances(engine: sa.Engine) -> None:
    p0, p1 = Stream("scheduler-events", 0), Stream("scheduler-events", 1)
    records = p0.records([
        at(SchedulerElected(epoch=2, scheduler_id="s-a"), T0, epoch=0),
        at(requested("w1"), T0 + 1, epoch=2),
        at(InstanceActivated(instance_name="w1", address="127.0.0.1:5001", cores_mcpu=3500),
           T0 + 3),
        at(InstanceCreated(instance_name="w1", inst_coll="standard"), T0 + 4, epoch=2),
        at(LogMarker(marker_id="m", kafka_partition=0), T0 + 5),
    ]) + p1.records([
        at(requested("w2"), T0 + 1, epoch=2),
        at(InstanceCreated(instance_name="w2", inst_coll="standard"), T0 + 2, epoch=2),
        at(InstanceDeactivated(instance_name="w2", reason="idle"), T0 + 6, epoch=2),
        at(InstanceDeleted(instance_name="w2", reason="idle"), T0 + 7, epoch=2),
        at(InstanceActivated(instance_name="w2", address="late", cores_mcpu=4000), T0 + 8),
        at(InstanceActivated(instance_name="w3", address="unknown", cores_mcpu=1), T0 + 9),
        at(requested("w4", 8000), T0 + 10, epoch=1),  # an older epoch: still a fact
    ])
    applied = Sink(engine, "instances").apply(records)
    assert applied.fresh == len(records) and applied.skipped_tags == 1  # the log marker
    rows = query(engine, "SELECT name, state, cores_mcpu, free_cores_mcpu, address, reason, "
                 "time_created_ms, time_activated_ms, time_deactivated_ms, time_deleted_ms, "
                 "last_updated_ms FROM instances ORDER BY name")
    assert rows == [
        ("w1", "active", 3500, 3500, "127.0.0.1:5001", None, T0 + 1, T0 + 3, None, None, T0 + 4),
        ("w2", "deleted", 4000, 0, None, "idle", T0 + 1, None, T0 + 6, T0 + 7, T0 + 7),
        ("w4", "pending", 8000, 0, None, None, T0 + 10, None, None, None, T0 + 10)]
    assert query(engine, "SELECT epoch, scheduler_id FROM scheduler_epochs") == [(2, "s-a")]
    live, deleted = Ops(Store(engine, "projector"), None).instances()
    assert [(i.state, i.n, i.cores, i.free_cores) for i in live] == [  # in the enum's order
        ("pending", 1, 8.0, 0.0), ("active", 1, 3.5, 3.5)]
    assert deleted == 1


def _rates(engine: sa.Engine) -> dict[tuple[int, str], int]:
    return {(int(m) - M0, str(k)): int(n) for m, k, n in query(
        engine, "SELECT minute, kind, SUM(n) FROM event_rates GROUP BY minute, kind")}


def test_execution_events_count_per_minute_once_per_record(engine: sa.Engine) -> None:
    batches = []
    for b, partition in ((101, 0), (102, 1)):
        stream = Stream("batch-events", partition)
        records = stream.records(submission(b, 1, [job(1), job(2), job(3)], create=True))

        def sj(j: int, t: int, b: int = b) -> Envelope:
            return at(JobScheduled(batch_id=b, job_id=j, attempt_id="a", instance_name="w1",
                                   inst_coll="standard", cores_mcpu=1000), t)

        mjc = at(JobCompleted(batch_id=b, job_id=1, attempt_id="a", instance_name="w1",
                              state="Success", end_time_ms=T0 + MIN + 5), T0 + MIN + 10)
        records += stream.records([
            sj(1, T0 + 5), sj(2, T0 + 6),
            at(JobStarted(batch_id=b, job_id=1, attempt_id="a", instance_name="w1",
                          start_time_ms=T0 + 7), T0 + MIN - 1),
            mjc, mjc,  # a worker's retried MJC: a second record on the log, counted again
            at(JobCancelled(batch_id=b, job_id=3, reason="user"), T0 + 2 * MIN),
        ])
        batches.append(records)
    sink = Sink(engine, "rates")
    sink.apply(batches[0])  # partition 0 in one transaction, partition 1 a record at a time
    for r in batches[1]:
        sink.apply([r])
    expected = {(0, "SJ"): 4, (0, "MJS"): 2, (1, "MJC"): 4, (2, "cancelled"): 2}
    assert _rates(engine) == expected
    tokens = query(engine, "SELECT DISTINCT token FROM event_rates ORDER BY token")
    assert tokens == [(0,), (1,)]  # each partition writes its own token rows
    sink.apply(batches[0] + batches[1])  # redelivered: already applied, counts nothing
    assert _rates(engine) == expected
    rates = Ops(Store(engine, "projector"), None).rates(now_ms=T0 + 2 * MIN + 30_000)
    five = rates.windows[0]
    assert (five.window_min, five.sj, five.mjs, five.mjc, five.count("cancelled")) == (
        5, 4, 2, 4, 2)
    assert five.per_min("SJ") == pytest.approx(4 / 4.5)  # 4 whole minutes and half of this one
    later = Ops(Store(engine, "projector"), None).rates(now_ms=T0 + 5 * MIN + 1)  # minutes 1-5
    assert [(r.window_min, r.sj, r.mjc) for r in later.windows] == [(5, 0, 4), (15, 4, 4)]
