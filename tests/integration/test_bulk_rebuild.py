"""The rebuild's bulk lanes project exactly what the projector's sink projects.

One log of varied histories, replayed into three fresh databases: through the sink event by
event (the reference), by a bulk lane in this process, and by bulk lanes in two processes.
The audit's table diff must find nothing between the reference and either bulk replay, and the
bulk replays must have folded the batches their path covers (not sent everything to the sink).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import msgspec
import pytest
import sqlalchemy as sa

from core.projection.bulk import ResourceLists, fold_batch
from schemas import codec
from schemas.base import AttemptResource, BatchEvent
from schemas.batch import BatchCancelled, JobGroupRecord, JobsSubmitted, UpdateCommitted
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    ResourceRateSet,
    UserCreated,
)
from schemas.envelope import Envelope, full, wrap
from schemas.events import AnyEvent
from schemas.execution import (
    RAW_VIEWS,
    AttemptHeartbeat,
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
    RawJobStarted,
)
from services.audit.rebuild import drop_database
from services.audit.replay import (
    ReplayStats,
    SinkTarget,
    Span,
    full_records,
    replay,
    replay_processes,
    spans,
)
from services.audit.tables import Comparison
from services.common.log import Publisher, Record, bootstrap_topics, high_watermarks
from services.common.settings import (
    LOCAL_BROKER_FETCH_MAX_WAIT_MS,
    DatabaseSettings,
    LogSettings,
    load_settings,
    projector_consumer,
)
from services.projector.app import PROJECTED_TOPICS
from services.projector.sink import Sink
from sql.migrate import apply_migrations

from .projection_helpers import job, query, submission

pytestmark = [pytest.mark.integration, pytest.mark.slow]
T0 = 1_767_225_600_000  # midnight UTC: attempts around it bill two days
RES = [AttemptResource(resource="compute/n1-standard/1", quantity=1000),
       AttemptResource(resource="memory/n1-standard/1", quantity=3840)]


def sj(b: int, j: int, a: str = "a1") -> JobScheduled:
    return JobScheduled(batch_id=b, job_id=j, attempt_id=a, instance_name=f"w{j % 3}",
                        inst_coll="standard", cores_mcpu=1000, resources=RES)


def mjs(b: int, j: int, a: str = "a1", at: int = T0 - 5_000) -> JobStarted:
    return JobStarted(batch_id=b, job_id=j, attempt_id=a, instance_name=f"w{j % 3}",
                      start_time_ms=at, resources=RES)


def mjc(b: int, j: int, a: str = "a1", state: str = "Success", end: int = T0 + 7_000, *,
        start_reported: bool = True) -> JobCompleted:
    return JobCompleted(batch_id=b, job_id=j, attempt_id=a, instance_name=f"w{j % 3}",
                        state=state,  # type: ignore[arg-type]
                        exit_code=0 if state == "Success" else 1, start_time_ms=T0 - 5_000,
                        end_time_ms=end + j, resources=RES, start_reported=start_reported,
                        # every other one compact: the facts its document follows from
                        **({"status": f'{{"job": {j}}}'} if j % 2 else {
                            "main_start_ms": T0 - 4_000 + j, "main_end_ms": end + j - 1,
                            "region": None if j % 4 else "us-central1"}))


def run(b: int, j: int, state: str = "Success", *, coalesced: bool = False) -> list[AnyEvent]:
    """SJ, MJS and MJC; SJ and an MJC that reports the start too when ``coalesced``."""
    if coalesced:
        return [sj(b, j), mjc(b, j, state=state, start_reported=False)]
    return [sj(b, j), mjs(b, j), mjc(b, j, state=state)]


def history(b: int) -> tuple[list[AnyEvent], set[int]]:
    """The log, and the batches the bulk path must fold."""
    chain = [job(1), *(job(j, 0, [j - 1]) for j in range(2, 6)), job(6), job(7, 0, [5, 6])]
    failing = [job(1), job(2, 0, [1]), job(3, 0, [1], always_run=True),
               job(4, always_run=True, cores=500)]
    control: list[AnyEvent] = [
        ResourceRateSet(resource="compute/n1-standard/1", rate=Decimal("0.00001")),
        ResourceRateSet(resource="memory/n1-standard/1", rate=Decimal("0.000001"))]
    for user in ("alice", "bob"):
        control += [UserCreated(user=user), BillingProjectCreated(billing_project="proj"),
                    BillingProjectMemberAdded(billing_project="proj", user=user)]
    retried = submission(b + 2, 1, [job(1), job(2), job(3, 0, [2])], create=True)
    bunch = next(e for e in retried if isinstance(e, JobsSubmitted))
    commit = next(e for e in retried if isinstance(e, UpdateCommitted))
    events: list[AnyEvent] = [
        *control,
        # A chain and a join, run in order, with heartbeats and duplicates.
        *submission(b, 1, chain, create=True),
        # A parent that fails: its child is flagged and never runs, the always_run one runs.
        *submission(b + 1, 1, failing, create=True, user="bob"),
        # A bunch retried before and after the commit, a duplicate commit.
        *retried[:-1], bunch, commit, commit, bunch,
        # Never committed.
        *submission(b + 3, 1, [job(1), job(2)], create=True, commit=False),
        # Committed with no jobs: complete at once.
        *submission(b + 4, 1, [], create=True),
        # Not the bulk path's: cancelled, and job groups.
        *submission(b + 5, 1, [job(1), job(2)], create=True),
        *submission(b + 6, 1, [job(1, 1)], [JobGroupRecord(job_group_id=1, parent_id=0)],
                    create=True),
        *run(b + 5, 1), BatchCancelled(batch_id=b + 5), *run(b + 6, 1),
        # Two attempts of one job; MJS before SJ; MJC before anything; still running.
        *submission(b + 7, 1, [job(1), job(2), job(3), job(4)], create=True),
        sj(b + 7, 1, "a1"), mjs(b + 7, 1, "a1"), sj(b + 7, 1, "a2"), mjs(b + 7, 1, "a2"),
        mjc(b + 7, 1, "a2"), mjc(b + 7, 1, "a1", "Failed"), mjs(b + 7, 2), sj(b + 7, 2),
        mjc(b + 7, 2), mjc(b + 7, 3, state="Error"), sj(b + 7, 4), mjs(b + 7, 4, at=T0 + 123),
        # SJs bunched as the scheduler publishes them (the child in a later round's bunch),
        # MJCs as a worker publishes them.
        *submission(b + 8, 1, [job(1), job(3), job(2, 0, [1])], create=True),
        JobsScheduled.of(b + 8, [sj(b + 8, 1), sj(b + 8, 3)]),
        JobsCompleted.of([msgspec.structs.replace(m, instance_name="w1") for m in (
            mjc(b + 8, 1, start_reported=False), mjc(b + 8, 3, state="Failed"))]),
        JobsScheduled.of(b + 8, [sj(b + 8, 2)]), mjc(b + 8, 2, start_reported=False),
    ]
    for j in range(1, 8):  # batch b, interleaved with the others' execution
        events += [sj(b, j), mjs(b, j),
                   AttemptHeartbeat(batch_id=b, job_id=j, attempt_id="a1", instance_name="w",
                                    rollup_time_ms=T0 + 1_000 * j),
                   mjc(b, j), *run(b + 2, j) * (j <= 3)]
    events += [mjc(b, 3), sj(b, 4)]  # late duplicates
    events += [*run(b + 1, 1, "Failed"), *run(b + 1, 4, coalesced=True), *run(b + 1, 3)]
    return events, {b, b + 1, b + 2, b + 3, b + 4, b + 7, b + 8}


@dataclass
class Log:
    settings: LogSettings
    todo: list[Span]
    folded_batches: set[int]


@pytest.fixture(scope="module")
def log(broker: str) -> Log:
    base = load_settings().log
    if not os.environ.get("HS_KAFKA_BOOTSTRAP"):  # our own tansu (see tests/conftest.py)
        base = msgspec.structs.replace(base, fetch_max_wait_ms=LOCAL_BROKER_FETCH_MAX_WAIT_MS)
    base = msgspec.structs.replace(base, bootstrap_servers=broker, partitions=2,
                                   topic_prefix=f"bulk{uuid.uuid4().hex[:8]}-")
    events, folded = history(500)

    async def publish() -> None:
        await bootstrap_topics(base)
        async with Publisher(base) as pub:
            await pub.publish_many(events)

    asyncio.run(publish())
    marks = asyncio.run(high_watermarks(base, PROJECTED_TOPICS))
    return Log(base, spans({}, marks, PROJECTED_TOPICS), folded)


@pytest.fixture
def databases(db_server: DatabaseSettings) -> Iterator[list[DatabaseSettings]]:
    dbs = [msgspec.structs.replace(db_server, name=f"hs_bulk_{uuid.uuid4().hex[:8]}_{i}")
           for i in range(3)]
    for db in dbs:
        apply_migrations(db)
    try:
        yield dbs
    finally:
        for db in dbs:
            drop_database(db_server, db.name)


def _replay(log: Log, db: DatabaseSettings, *, bulk: bool, processes: int = 1) -> ReplayStats:
    """In this process through an engine that cannot load files (folded rows are inserted),
    or in lane processes, whose engines load them (services/audit/load.py)."""
    consumer = projector_consumer(log.settings)
    if processes > 1:
        return asyncio.run(replay_processes(log.settings, SinkTarget(db, consumer), log.todo,
                                            batch_size=3, processes=processes, bulk=bulk))
    engine = sa.create_engine(db.url())
    try:
        return asyncio.run(replay(log.settings, Sink(engine, consumer), log.todo,
                                  batch_size=3, bulk=bulk))
    finally:
        engine.dispose()


def test_bulk_lanes_project_what_the_sink_projects(log: Log, db_server: DatabaseSettings,
                                                   databases: list[DatabaseSettings]) -> None:
    reference, in_process, in_processes = databases
    by_sink = _replay(log, reference, bulk=False)
    assert by_sink.folded == 0
    total = sum(s.size for s in log.todo)
    for db, processes in ((in_process, 1), (in_processes, 2)):
        stats = _replay(log, db, bulk=True, processes=processes)
        assert stats.events == total
        assert 0 < stats.folded < total
        assert (stats.loaded > 0) == (processes > 1)
        engine = sa.create_engine(reference.url())
        try:
            with engine.connect() as a, engine.connect() as b:
                comparison = Comparison(a, reference.name, b, db.name)
                assert list(comparison) == [] and comparison.tables >= 20
            offsets = query(engine, f"SELECT topic, kafka_partition, next_offset FROM "
                                    f"`{db.name}`.applied_offsets ORDER BY 1, 2")
            assert offsets == query(engine, f"SELECT topic, kafka_partition, next_offset FROM "
                                            f"`{reference.name}`.applied_offsets ORDER BY 1, 2")
        finally:
            engine.dispose()


def test_the_fold_takes_exactly_the_common_histories(log: Log) -> None:
    events, folded = history(500)
    by_batch: dict[int, list[tuple[BatchEvent, int]]] = {}
    for e in events:
        if isinstance(e, BatchEvent):
            by_batch.setdefault(e.batch_id, []).append((e, T0))
    taken = {b for b, h in by_batch.items() if fold_batch(h, token=0) is not None}
    assert taken == folded


def _as_bulk_lanes_decode(events: list[AnyEvent]) -> list[Envelope]:
    return codec.decode_many([codec.encode(wrap(e, event_id=f"e{i}", time_ms=T0 + i))
                              for i, e in enumerate(events)], bulk=True)


def test_the_fold_of_undecoded_resources_is_the_fold_of_the_events() -> None:
    """Bulk lanes fold SJ, MJS and MJC with their resources undecoded: the same operations,
    for the same batches, as the events themselves; one resource list cache for them all."""
    events, folded = history(500)
    envs = _as_bulk_lanes_decode(events)
    assert any(type(e.event) in RAW_VIEWS.values() for e in envs)
    plain: dict[int, list[tuple[BatchEvent, int]]] = {}
    views: dict[int, list[tuple[BatchEvent, int]]] = {}
    for e, env in zip(events, envs, strict=True):
        if isinstance(e, BatchEvent):
            plain.setdefault(e.batch_id, []).append((e, env.time_ms))
            views.setdefault(e.batch_id, []).append((env.event, env.time_ms))
    lists: ResourceLists = {}
    for b in plain:
        assert fold_batch(views[b], token=1, resource_lists=lists) == fold_batch(
            plain[b], token=1), b
    assert {b for b in views if fold_batch(views[b], token=1) is not None} == folded
    assert list(lists.values()) == [tuple((r.resource, r.quantity) for r in RES)]


def test_a_bad_undecoded_resource_list_is_not_folded_and_named_where_it_is() -> None:
    """The bulk decode leaves resources unchecked: the fold leaves such a batch to the sink's
    path, which refuses the record by its position, as a decode of it would have."""
    events, _ = history(500)
    envs = _as_bulk_lanes_decode(events)
    i = next(i for i, e in enumerate(envs) if type(e.event) is RawJobStarted
             and e.event.batch_id == 500)
    bad = msgspec.structs.replace(envs[i].event, resources=msgspec.Raw(b"\x91\x05"))
    envs[i] = msgspec.structs.replace(envs[i], event=bad)
    batch = [(env.event, env.time_ms) for env in envs
             if isinstance(env.event, BatchEvent) and env.event.batch_id == 500]
    assert fold_batch(batch, token=0) is None
    span = Span("batch", 0, 0, len(envs))
    records = [Record("batch", 0, offset, env) for offset, env in enumerate(envs)]
    assert full_records(span, records[:i]) == [
        Record("batch", 0, r.offset, full(r.envelope)) for r in records[:i]]
    with pytest.raises(codec.DecodeError, match=re.escape(f"{span.label}@{i}: invalid resources")):
        full_records(span, records)


def test_a_bunch_with_a_job_twice_is_left_to_the_sink() -> None:
    """The fold counts a bunch's jobs as it stages them; a job twice in one bunch would be
    counted twice and written once, so such a history goes to the sink."""
    events = [e for e in submission(900, 1, [job(1), job(2)], create=True)
              if isinstance(e, BatchEvent)]
    bunch = next(e for e in events if isinstance(e, JobsSubmitted))
    twice = msgspec.structs.replace(bunch, jobs=[*bunch.jobs, bunch.jobs[0]])
    assert fold_batch([(e, T0) for e in events], token=0) is not None
    assert fold_batch([(twice if e is bunch else e, T0) for e in events], token=0) is None
