"""Ingest's read-your-writes wait: every waiting request shares one poller of ``applied_offsets``.

The projector's part (advancing ``applied_offsets``) is played by plain UPDATEs on a migrated
MariaDB database; the waits are :meth:`Store.wait_applied` as ingest's commands call it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from services.common.log import LogPosition
from services.common.settings import DatabaseSettings
from services.ingest.store import Store

pytestmark = pytest.mark.integration

CONSUMER = "projector-under-test"


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url(), pool_pre_ping=True)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM applied_offsets WHERE consumer = :c"), {"c": CONSUMER})
        for topic, partition in (("batch", 0), ("batch", 1), ("control", 0)):
            conn.execute(sa.text(
                "INSERT INTO applied_offsets (consumer, topic, kafka_partition, next_offset, "
                "updated_at_ms) VALUES (:c, :t, :p, 0, 0)"), {"c": CONSUMER, "t": topic,
                                                             "p": partition})
    try:
        yield engine
    finally:
        engine.dispose()


def _apply(engine: sa.Engine, topic: str, partition: int, next_offset: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE applied_offsets SET next_offset = :n WHERE consumer = :c AND topic = :t "
            "AND kafka_partition = :p"), {"n": next_offset, "c": CONSUMER, "t": topic,
                                          "p": partition})


async def test_waiters_end_as_the_projector_reaches_their_offsets(engine: sa.Engine) -> None:
    store = Store(engine, CONSUMER)
    done: list[int] = []

    async def wait(i: int, positions: list[LogPosition]) -> None:
        assert await store.wait_applied(positions, timeout_s=20)
        done.append(i)

    tasks = [asyncio.create_task(wait(i, [LogPosition("batch", 0, 10 * i)])) for i in range(8)]
    tasks.append(asyncio.create_task(wait(100, [LogPosition("batch", 0, 5),
                                                LogPosition("batch", 1, 3)])))
    await asyncio.sleep(0.1)
    assert done == []
    for reached in (15, 41, 80):  # next offsets: 15 applies offsets 0..14
        await asyncio.to_thread(_apply, engine, "batch", 0, reached)
        await asyncio.sleep(0.15)
        assert sorted(d for d in done if d < 100) == [i for i in range(8) if 10 * i < reached]
        assert 100 not in done  # its other partition is not there yet
    await asyncio.to_thread(_apply, engine, "batch", 1, 4)
    await asyncio.gather(*tasks)
    assert 100 in done
    await asyncio.sleep(0.1)  # nobody waits: the poller gives its connection back, and ends
    assert engine.pool.checkedout() == 0
    assert store._poller is not None and store._poller.done()


async def test_a_wait_that_is_never_reached_times_out_and_the_others_still_end(
        engine: sa.Engine) -> None:
    store = Store(engine, CONSUMER)
    await asyncio.to_thread(_apply, engine, "control", 0, 7)
    t0 = time.monotonic()
    stuck = asyncio.create_task(store.wait_applied([LogPosition("control", 0, 50)],
                                                   timeout_s=0.5))
    # already applied: ends on the first poll, while the other still waits
    assert await store.wait_applied([LogPosition("control", 0, 6)], timeout_s=5)
    assert time.monotonic() - t0 < 0.4
    assert await stuck is False
    assert time.monotonic() - t0 >= 0.5
    # a partition the projector never stored counts as nothing applied
    assert await store.wait_applied([LogPosition("nowhere", 3, 0)], timeout_s=0.2) is False
    assert await store.wait_applied([], timeout_s=0.01)


async def test_a_database_error_fails_every_waiter(migrated_db: DatabaseSettings) -> None:
    # The same server, a database that does not exist: every poll fails.
    missing = sa.create_engine(migrated_db.url().rsplit("/", 1)[0] + "/hs_no_such_database")
    try:
        store = Store(missing, CONSUMER)
        waits = [store.wait_applied([LogPosition("batch", 0, i)], timeout_s=10)
                 for i in range(3)]
        t0 = time.monotonic()
        results = await asyncio.gather(*waits, return_exceptions=True)
        assert time.monotonic() - t0 < 5
        assert all(isinstance(r, sa.exc.OperationalError) for r in results), results
        assert "hs_no_such_database" in str(results[0])
    finally:
        missing.dispose()


async def test_with_slack_a_wait_ends_that_many_records_short(engine: sa.Engine) -> None:
    store = Store(engine, CONSUMER)
    await asyncio.to_thread(_apply, engine, "batch", 1, 7)  # offsets 0..6 applied
    # offset 10, slack 3: ends once the projector is at most 3 records short of it
    assert await store.wait_applied([LogPosition("batch", 1, 10)], timeout_s=0.3,
                                    slack=3) is False
    await asyncio.to_thread(_apply, engine, "batch", 1, 8)  # 7 applied: 3 short of 10
    assert await store.wait_applied([LogPosition("batch", 1, 10)], timeout_s=5, slack=3)
    # a slack beyond the offset: nothing to wait for, not even a first poll
    assert await store.wait_applied([LogPosition("control", 0, 2)], timeout_s=0.01, slack=3)


async def test_a_slack_wait_that_an_earlier_poll_covers_ends_without_a_query(
        engine: sa.Engine) -> None:
    store = Store(engine, CONSUMER)
    await asyncio.to_thread(_apply, engine, "batch", 0, 20)  # offsets 0..19 applied
    assert await store.wait_applied([LogPosition("batch", 0, 19)], timeout_s=5)
    polls = 0
    applied_offsets = store.applied_offsets

    def counted() -> dict[tuple[str, int], int]:
        nonlocal polls
        polls += 1
        return applied_offsets()

    store.applied_offsets = counted  # type: ignore[method-assign]
    # The projector's progress seen before is a lower bound: pacing waits within it end at
    # once, and the database is not asked.
    assert await store.wait_applied([LogPosition("batch", 0, 22)], timeout_s=5, slack=3)
    assert await store.wait_applied([LogPosition("batch", 0, 25)], timeout_s=0.01, slack=10)
    assert polls == 0
    # Beyond what was seen, the wait polls (and sees the projector further on).
    await asyncio.to_thread(_apply, engine, "batch", 0, 40)
    assert await store.wait_applied([LogPosition("batch", 0, 30)], timeout_s=5, slack=3)
    assert polls >= 1
    before = polls
    assert await store.wait_applied([LogPosition("batch", 0, 42)], timeout_s=5, slack=3)
    assert polls == before
    # A read-your-writes wait (no slack) always asks: a rebuilt projection may be behind.
    assert await store.wait_applied([LogPosition("batch", 0, 5)], timeout_s=5)
    assert polls == before + 1


async def test_a_request_cancelled_as_its_wait_ends_ends_cancelled(engine: sa.Engine) -> None:
    """The projector reaching the offset in the same turn as the request's cancellation (its
    client gone, say): the request ends cancelled. ``asyncio.wait_for`` on Python 3.11 returned
    True there, dropping the cancellation, and the handler went on."""
    store = Store(engine, CONSUMER)
    task = asyncio.create_task(store.wait_applied([LogPosition("batch", 0, 5)], timeout_s=20))
    for _ in range(3):
        await asyncio.sleep(0)
    (waiter,) = store._waiters
    waiter.done.set_result(True)  # as the poller does when it sees the offset applied
    task.cancel()
    (result,) = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(result, asyncio.CancelledError), result
