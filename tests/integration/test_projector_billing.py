"""Billing in the projector: attempts accrue usage with heartbeats and completion, into every
rollup, exactly once, and cost comes out of the rates."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
import sqlalchemy as sa

from core.billing import Machine, attempt_resources, default_rates, usage_of_text
from schemas.base import AttemptResource
from schemas.batch import JobGroupRecord
from schemas.control import ResourceRateSet
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    JobCompleted,
    JobScheduled,
    JobStarted,
)
from services.common.settings import DatabaseSettings
from services.ingest.query_sql import cost_breakdown_query
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, job, query, submission

pytestmark = pytest.mark.integration

MACHINE = Machine("standard", True, 16_000)
RES = attempt_resources(1000, MACHINE)
TABLES = ("aggregated_job_group_resources", "aggregated_batch_resources",
          "aggregated_billing_project_resources",
          "aggregated_billing_project_user_resources_by_date", "aggregated_user_resources")


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


@pytest.fixture
def sink(engine: sa.Engine, request: pytest.FixtureRequest) -> Sink:
    sink = Sink(engine, request.node.name)
    control = Stream(topic="control-events")
    sink.apply(control.records([ResourceRateSet(resource=r, rate=rate)
                                for r, rate in default_rates().items()]))
    return sink


def sj(b: int, j: int, a: str, resources: list[AttemptResource] = RES) -> JobScheduled:
    return JobScheduled(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        inst_coll="standard", cores_mcpu=1000, resources=resources)


def mjs(b: int, j: int, a: str, start: int) -> JobStarted:
    return JobStarted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                      start_time_ms=start, resources=RES)


def beat(b: int, j: int, a: str, t: int) -> AttemptHeartbeat:
    return AttemptHeartbeat(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                            rollup_time_ms=t)


def mjc(b: int, j: int, a: str, start: int, end: int) -> JobCompleted:
    return JobCompleted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        state="Success", exit_code=0, start_time_ms=start, end_time_ms=end,
                        resources=RES)


def usage_of(engine: sa.Engine, table: str, where: str = "", **params: object) -> dict[str, int]:
    rows = query(engine, f"SELECT resource, SUM(resource_usage) FROM {table} "
                 f"WHERE {where or 'TRUE'} GROUP BY resource", **params)
    return {str(r): int(u) for r, u in rows}


def job_usage(engine: sa.Engine, batch_id: int, job_id: int | None = None) -> dict[str, int]:
    """The usage of a job (or every job of the batch), from ``jobs.resource_usage``."""
    out: dict[str, int] = {}
    for (text,) in query(engine, "SELECT resource_usage FROM jobs WHERE batch_id = :b AND "
                         "(:j IS NULL OR job_id = :j)", b=batch_id, j=job_id):
        for resource, amount in usage_of_text(text).items():
            out[resource] = out.get(resource, 0) + amount
    return out


def expected(ms: int) -> dict[str, int]:
    return {r.resource: r.quantity * ms for r in RES}


def test_heartbeats_and_completion_bill_start_to_end_once_into_every_rollup(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    groups = [JobGroupRecord(job_group_id=1, parent_id=0)]
    sink.apply(s.records(submission(1, 1, [job(1, 1), job(2)], groups, create=True,
                                    user="alice")))
    start = T0 + 1_000
    sink.apply(s.records([sj(1, 1, "a1"), mjs(1, 1, "a1", start)]))
    assert usage_of(engine, "aggregated_batch_resources", "batch_id = 1") == {}  # no report yet
    sink.apply(s.records([beat(1, 1, "a1", start + 60_000)]))
    assert usage_of(engine, "aggregated_batch_resources", "batch_id = 1") == expected(60_000)
    # a duplicate and a stale heartbeat bill nothing more
    sink.apply(s.records([beat(1, 1, "a1", start + 60_000), beat(1, 1, "a1", start + 30_000)]))
    sink.apply(s.records([mjc(1, 1, "a1", start, start + 90_000)]))
    sink.apply(s.records([mjc(1, 1, "a1", start, start + 90_000),     # duplicate MJC
                          beat(1, 1, "a1", start + 120_000)]))        # heartbeat after the end
    want = expected(90_000)
    where = {"aggregated_job_group_resources": "batch_id = 1 AND job_group_id = 1",
             "aggregated_batch_resources": "batch_id = 1",
             "aggregated_billing_project_resources": "billing_project = 'proj'",
             "aggregated_billing_project_user_resources_by_date":
                 "billing_project = 'proj' AND user = 'alice'",
             "aggregated_user_resources": "user = 'alice'"}
    for table in TABLES:  # the module's other tests bill other batches and users
        assert usage_of(engine, table, where[table]) == want, table
    assert usage_of(engine, "aggregated_job_group_resources",
                    "batch_id = 1 AND job_group_id = 0") == want
    assert job_usage(engine, 1, 1) == want
    assert job_usage(engine, 1, 2) == {}
    # cost is usage times the rates, per resource and in total
    stmt, params = cost_breakdown_query(1)
    with engine.connect() as conn:
        rows = conn.execute(stmt, params).all()
    rates = default_rates()
    assert {r.resource: Decimal(r.cost) for r in rows} == {
        r: rates[r] * u for r, u in want.items()}
    assert sum(Decimal(r.cost) for r in rows) > 0


def test_lost_attempts_bill_up_to_their_end_and_unstarted_ones_nothing(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(2, 1, [job(1)], create=True, user="bob")))
    start = T0 + 5_000
    sink.apply(s.records([sj(2, 1, "a1"), mjs(2, 1, "a1", start),
                          beat(2, 1, "a1", start + 10_000),
                          AttemptLost(batch_id=2, job_id=1, attempt_id="a1", instance_name="w1",
                                      reason="instance_lost", end_time_ms=start + 25_000)]))
    # the second attempt is lost before it starts: nothing to bill
    sink.apply(s.records([sj(2, 1, "a2"),
                          AttemptLost(batch_id=2, job_id=1, attempt_id="a2", instance_name="w1",
                                      reason="delivery_failed", end_time_ms=start + 26_000)]))
    sink.apply(s.records([sj(2, 1, "a3"), mjs(2, 1, "a3", start + 30_000),
                          mjc(2, 1, "a3", start + 30_000, start + 40_000)]))
    assert job_usage(engine, 2) == expected(35_000)
    assert usage_of(engine, "aggregated_user_resources", "user = 'bob'") == expected(35_000)


def test_completion_that_overtakes_its_start_still_bills_from_its_start(
        engine: sa.Engine, sink: Sink) -> None:
    s = Stream()
    sink.apply(s.records(submission(3, 1, [job(1)], create=True)))
    start = T0 + 1_000
    sink.apply(s.records([sj(3, 1, "a1"), mjc(3, 1, "a1", start, start + 7_000),
                          mjs(3, 1, "a1", start)]))
    assert usage_of(engine, "aggregated_batch_resources", "batch_id = 3") == expected(7_000)


def test_a_completion_without_its_start_projects_as_start_then_completion(
        engine: sa.Engine, sink: Sink) -> None:
    """A worker leaves out the MJS of an attempt that ends before it is due: the MJC alone must
    leave the job, its attempt and every rollup as the MJS and MJC together do."""
    s = Stream()
    start = T0 + 2_000
    for batch_id, with_start in ((4, True), (5, False)):
        sink.apply(s.records(submission(batch_id, 1, [job(1)], create=True, user="carol")))
        events: list[JobScheduled | JobStarted | JobCompleted] = [sj(batch_id, 1, "a1")]
        if with_start:
            events.append(mjs(batch_id, 1, "a1", start))
        events.append(mjc(batch_id, 1, "a1", start, start + 3_000))
        sink.apply(s.records(events))

    def projected(batch_id: int) -> tuple[object, ...]:
        (job_row,) = query(engine, "SELECT state, attempt_id, start_time_ms, end_time_ms, "
                           "n_attempts FROM jobs WHERE batch_id = :b", b=batch_id)
        attempts = query(engine, "SELECT attempt_id, instance_name, start_time_ms, end_time_ms "
                         "FROM attempts WHERE batch_id = :b", b=batch_id)
        usage = {t: usage_of(engine, t, "batch_id = :b", b=batch_id) for t in TABLES[:2]}
        usage["jobs"] = job_usage(engine, batch_id)
        return job_row, attempts, usage

    with_start, without = projected(4), projected(5)
    assert without == with_start
    assert with_start[0] == ("Success", "a1", start, start + 3_000, 1)
    assert with_start[2]["aggregated_batch_resources"] == expected(3_000)
