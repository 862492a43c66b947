"""The log adapter against the real broker and MariaDB."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from schemas.batch import BatchCreated
from schemas.execution import AttemptHeartbeat
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    Publisher,
    Record,
    bootstrap_topics,
    high_watermarks,
    partitions_of,
    unready_topics,
)
from services.common.offsets import MySQLOffsetStore
from services.common.settings import ALL_TOPICS, TOPIC_BATCH, DatabaseSettings, LogSettings

pytestmark = pytest.mark.integration

N_EVENTS = 10_000
N_KEYS = 50


def heartbeat(batch_id: int, seq: int) -> AttemptHeartbeat:
    return AttemptHeartbeat(batch_id=batch_id, job_id=seq, attempt_id=f"a{seq}",
                            instance_name="w", rollup_time_ms=seq)


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS test_applied"))
        conn.execute(sa.text(
            "CREATE TABLE test_applied (batch_id BIGINT, seq BIGINT, PRIMARY KEY (batch_id, seq))"
        ))
    yield engine
    engine.dispose()


async def test_bootstrap_creates_topics_once(log_settings: LogSettings) -> None:
    created = await bootstrap_topics(log_settings)
    assert sorted(created) == sorted(log_settings.topic(t) for t in ALL_TOPICS)
    assert await partitions_of(log_settings, TOPIC_BATCH) == [0, 1, 2, 3]
    assert await bootstrap_topics(log_settings) == []


def _described(topic: str, leaders: list[int], error_code: int = 0) -> dict[str, object]:
    return {"topic": topic, "error_code": error_code, "partitions": [
        {"partition": i, "leader": leader, "error_code": 0} for i, leader in enumerate(leaders)]}


def test_a_topic_is_ready_once_every_partition_has_a_leader() -> None:
    assert unready_topics([_described("a", [1, 1, 2, 1])], 4) == []
    assert unready_topics([_described("a", [1, 1, 2, 1, 1])], 4) == []  # made bigger elsewhere
    assert unready_topics([_described("a", [1, -1, 2, 1]), _described("b", [1] * 4)], 4) == ["a"]
    assert unready_topics([_described("a", [1, 1])], 4) == ["a"]
    assert unready_topics([_described("a", [], error_code=3)], 4) == ["a"]
    part_error = _described("a", [1] * 4)
    part_error["partitions"][0]["error_code"] = 5  # type: ignore[index]
    assert unready_topics([part_error], 4) == ["a"]


async def test_bootstrapped_topics_are_described_whole(log_settings: LogSettings) -> None:
    """Once bootstrap returns, every created topic has all its partitions, each with a leader."""
    from aiokafka.admin import AIOKafkaAdminClient

    created = await bootstrap_topics(log_settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=log_settings.bootstrap_servers)
    await admin.start()
    try:
        assert unready_topics(await admin.describe_topics(created), 4) == []
    finally:
        await admin.close()


async def test_publish_returns_position_and_keeps_key_in_one_partition(
        log_settings: LogSettings) -> None:
    await bootstrap_topics(log_settings)
    async with Publisher(log_settings) as pub:
        first = await pub.publish(heartbeat(7, 0))
        rest = await pub.publish_many([heartbeat(7, i) for i in range(1, 20)])
    assert first.topic == TOPIC_BATCH
    positions = [first, *rest]
    assert {p.partition for p in positions} == {first.partition}
    assert [p.offset for p in positions] == list(range(first.offset, first.offset + 20))


async def _consume_all(consumer: LogConsumer, n: int, timeout_s: float = 60) -> list[Record]:
    got: list[Record] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            got += await consumer.next_batch()
    return got


async def test_ten_thousand_events_keep_per_key_order(log_settings: LogSettings) -> None:
    await bootstrap_topics(log_settings)
    events = [heartbeat(i % N_KEYS, i // N_KEYS) for i in range(N_EVENTS)]
    async with Publisher(log_settings) as pub:
        positions = await pub.publish_many(events)
    assert len({(p.partition, p.offset) for p in positions}) == N_EVENTS

    options = ConsumerOptions(name="order-test", topics=[TOPIC_BATCH])
    async with LogConsumer(log_settings, options) as consumer:
        got = await _consume_all(consumer, N_EVENTS)
    assert len(got) == N_EVENTS
    per_key: dict[int, list[int]] = defaultdict(list)
    partition_of_key: dict[int, set[int]] = defaultdict(set)
    for r in got:
        ev = r.envelope.event
        assert isinstance(ev, AttemptHeartbeat)
        per_key[ev.batch_id].append(ev.rollup_time_ms)
        partition_of_key[ev.batch_id].add(r.partition)
    assert sorted(per_key) == list(range(N_KEYS))
    for key, seqs in per_key.items():
        assert seqs == list(range(N_EVENTS // N_KEYS)), f"key {key} out of order"
        assert len(partition_of_key[key]) == 1

    marks = await high_watermarks(log_settings, [TOPIC_BATCH])
    assert sum(marks.values()) == N_EVENTS


async def test_a_watermark_read_logs_no_assignment_and_other_assignments_still_log(
        log_settings: LogSettings, caplog: pytest.LogCaptureFixture) -> None:
    await bootstrap_topics(log_settings)
    subscriptions = "aiokafka.consumer.subscription_state"
    with caplog.at_level(logging.INFO):
        marks = await high_watermarks(log_settings, [TOPIC_BATCH])
        assert set(marks) == {(TOPIC_BATCH, p) for p in range(log_settings.partitions)}
        assert [r.getMessage() for r in caplog.records if r.name == subscriptions] == []
        logging.getLogger(subscriptions).info("Updating subscribed topics to: %s", {"t"})
    assert [r.name for r in caplog.records].count(subscriptions) == 1


def _insert(conn: sa.Connection, records: list[Record]) -> int:
    rows = []
    for r in records:
        ev = r.envelope.event
        assert isinstance(ev, AttemptHeartbeat)
        rows.append({"b": ev.batch_id, "s": ev.rollup_time_ms})
    # A plain INSERT: a record applied twice would violate the primary key.
    conn.execute(sa.text("INSERT INTO test_applied (batch_id, seq) VALUES (:b, :s)"), rows)
    return len(rows)


async def test_consumer_resumes_from_offsets_stored_in_the_database(
        log_settings: LogSettings, engine: sa.Engine) -> None:
    await bootstrap_topics(log_settings)
    total = 3_000
    async with Publisher(log_settings) as pub:
        await pub.publish_many([heartbeat(i % 30, i // 30) for i in range(total)])
    store = MySQLOffsetStore(engine)
    options = ConsumerOptions(name="projector-test", topics=[TOPIC_BATCH], max_records=500)

    # First run: apply about half, then "crash" (stop without anything else).
    applied = 0
    replayable: list[Record] = []
    async with LogConsumer(log_settings, options, store) as consumer:
        while applied < total // 2:
            batch = await consumer.next_batch()
            n, _ = store.apply(options.name, batch, _insert)
            applied += n
            replayable += batch

    # Re-delivery of what was applied is skipped, in full.
    assert store.apply(options.name, replayable, _insert) == (0, None)

    # Second run resumes where the database says, and finishes exactly once.
    async with LogConsumer(log_settings, options, store) as consumer:
        async with asyncio.timeout(60):
            while applied < total:
                n, _ = store.apply(options.name, await consumer.next_batch(), _insert)
                applied += n
        assert await consumer.next_batch() == []  # nothing left, nothing re-read
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM test_applied")).scalar_one() == total
    stored = store.load(options.name, [TOPIC_BATCH])
    marks = await high_watermarks(log_settings, [TOPIC_BATCH])
    assert stored == {k: v for k, v in marks.items() if v > 0}


async def test_ungrouped_consumer_reads_every_partition_from_the_start(
        log_settings: LogSettings) -> None:
    await bootstrap_topics(log_settings)
    async with Publisher(log_settings) as pub:
        await pub.publish_many([
            BatchCreated(batch_id=i, user="u", billing_project="p", token=f"t{i}")
            for i in range(40)])
    options = ConsumerOptions(name="replay", topics=[TOPIC_BATCH], group=False)
    async with LogConsumer(log_settings, options) as consumer:
        got = await _consume_all(consumer, 40)
        assert consumer.assignment() == {(TOPIC_BATCH, p) for p in range(4)}
    assert sorted(r.envelope.event.batch_id for r in got) == list(range(40))  # type: ignore[union-attr]


async def test_two_group_members_split_partitions(log_settings: LogSettings) -> None:
    await bootstrap_topics(log_settings)
    async with Publisher(log_settings) as pub:
        await pub.publish_many([heartbeat(i, 0) for i in range(200)])
    options = ConsumerOptions(name="split", topics=[TOPIC_BATCH])
    async with LogConsumer(log_settings, options) as a, LogConsumer(log_settings, options) as b:
        seen: list[Record] = []
        async with asyncio.timeout(60):
            while len(seen) < 200 or not (a.assignment() and b.assignment()):
                seen += await a.next_batch()
                seen += await b.next_batch()
        assert a.assignment().isdisjoint(b.assignment())
        assert a.assignment() | b.assignment() == {(TOPIC_BATCH, p) for p in range(4)}
    assert len({(r.partition, r.offset) for r in seen}) == 200


async def test_a_consumer_reading_while_producers_append_sees_every_offset_in_order(
        log_settings: LogSettings) -> None:
    """Six producers append small batches to one partition while a consumer reads it. The
    local broker can serve a later batch before an earlier one is readable (once in ~90,000
    records here before the fix); the consumer must wait for the hole, never skip it."""
    await bootstrap_topics(log_settings)
    stop = asyncio.Event()

    async def produce(writer: int) -> int:
        n = 0
        async with Publisher(log_settings) as pub:
            while not stop.is_set():
                await pub.publish_many([heartbeat(1, writer * 10**6 + n + i) for i in range(10)])
                n += 10
        return n

    options = ConsumerOptions(name="holes", topics=[TOPIC_BATCH], group=False)
    async with LogConsumer(log_settings, options) as consumer:
        producers = [asyncio.create_task(produce(w)) for w in range(6)]
        got: list[Record] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 8
        while loop.time() < deadline:
            got += await consumer.next_batch()
        stop.set()
        sent = sum(await asyncio.gather(*producers))
        got += await _consume_all(consumer, sent - len(got))
    offsets = [r.offset for r in got]
    assert len({r.partition for r in got}) == 1
    assert offsets == list(range(len(offsets)))
    assert len(offsets) == sent
