"""Cancelling the start of a log client at any step leaves no connection open.

aiokafka's bootstrap leaks the connection it asks for metadata on when cancelled mid-request;
CI once failed on that socket, garbage-collected in a later test (a replay stopped while its
reader started). Each client here is started and cancelled after 0, 1, 2, ... turns of the event
loop (more and more) until a start ends before its cancellation, so every step of a start is hit.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from services.audit.logread import PartitionReader
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    Publisher,
    bootstrap_topics,
    high_watermarks,
    start_client,
    stop_client,
)
from services.common.settings import TOPIC_BATCH, LogSettings

pytestmark = pytest.mark.integration

MAX_TRIES = 140
"""Starts tried per client, a bound so the test ends: every turn up to 40, then turns growing
by a tenth each time (waiting for the broker, a start spends many turns on one step). An
ungrouped consumer's start waits out the fetch wait three times: about 77,000 turns at the local
broker's 60 ms, which the 120th try barely reaches; the 140th tries some 550,000."""


ENDS_WITHIN_S = 60.0
"""A cancelled use ends within this (a start's grace is 5 s, a stop's 10 s); past it, the
cancellation was lost and the use would sleep on."""


def _turns(tries: int) -> Iterator[int]:
    turns = 0
    for _ in range(tries):
        yield turns
        turns = turns + 1 if turns < 40 else int(turns * 1.1)

Use = Callable[[Callable[[], None]], Awaitable[None]]
"""Starts a client, calls its argument once started, then waits to be cancelled."""


def _cancel_at_every_turn(use: Use, *, tries: int = MAX_TRIES, until_up: bool = True) -> int:
    """Cancel ``use`` after k loop turns for growing k until it got past its start (or for
    ``tries`` turns, without ``until_up``); return how many cancellations hit a start still
    going on. Fails on any unclosed connection."""

    async def once(turns: int) -> bool:
        up = asyncio.Event()
        task = asyncio.create_task(use(up.set))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=ENDS_WITHIN_S)
        assert done, (f"cancelled after {turns} turns, the client's use did not end in "
                      f"{ENDS_WITHIN_S:g} s: a cancellation was swallowed")
        (result,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(result, asyncio.CancelledError), result
        return up.is_set()

    mid_start = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for turns in _turns(tries):
            past = asyncio.run(once(turns))
            gc.collect()  # an unclosed connection warns when collected
            if past:
                break
            mid_start += 1
        else:
            if until_up:
                pytest.fail(f"no start ended in {tries} tries")
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    return mid_start


async def _wait_forever(up: Callable[[], None]) -> None:
    up()
    await asyncio.sleep(3600)


def test_a_partition_reader(log_settings: LogSettings) -> None:
    async def use(up: Callable[[], None]) -> None:
        async with PartitionReader(log_settings):
            await _wait_forever(up)

    assert _cancel_at_every_turn(use) > 5


def test_an_ungrouped_consumer(log_settings: LogSettings) -> None:
    asyncio.run(bootstrap_topics(log_settings, [TOPIC_BATCH]))

    async def use(up: Callable[[], None]) -> None:
        async with LogConsumer(log_settings, ConsumerOptions(
                name="cancel", topics=[TOPIC_BATCH], group=False)):
            await _wait_forever(up)

    assert _cancel_at_every_turn(use) > 5


def test_a_publisher(log_settings: LogSettings) -> None:
    async def use(up: Callable[[], None]) -> None:
        async with Publisher(log_settings):
            await _wait_forever(up)

    assert _cancel_at_every_turn(use) > 5


def test_a_high_watermark_read_and_a_topic_bootstrap(log_settings: LogSettings) -> None:
    asyncio.run(bootstrap_topics(log_settings, [TOPIC_BATCH]))

    async def marks(up: Callable[[], None]) -> None:
        await high_watermarks(log_settings, [TOPIC_BATCH])
        await _wait_forever(up)

    async def topics(up: Callable[[], None]) -> None:
        await bootstrap_topics(log_settings, [TOPIC_BATCH])
        await _wait_forever(up)

    # Reading the marks spends a second or two in fetches after its start: only the start and
    # the first fetches are swept.
    assert _cancel_at_every_turn(marks, tries=60, until_up=False) == 60
    assert _cancel_at_every_turn(topics) > 5


def test_a_cancellation_while_a_client_stops_reaches_the_caller(log_settings: LogSettings) -> None:
    """aiokafka's close awaits its metadata task under ``suppress(CancelledError)``: a caller
    cancelled there lost its cancellation and went on (a cancelled topic bootstrap returned,
    then slept). Cancelled at every turn of a stop, the caller ends cancelled, and the client's
    connections are closed all the same."""

    async def once(turns: int) -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=log_settings.bootstrap_servers)
        await admin.start()
        await admin.list_topics()  # a connection to the broker, beside the bootstrap one
        task = asyncio.create_task(stop_client(admin.close))
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.done():
            await task
            return False
        task.cancel()
        (result,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(result, asyncio.CancelledError), (turns, result)
        assert admin._closed
        return True

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        mid_stop = 0
        for turns in range(1, 40):  # after 0 turns the task never started: no stop to cut
            if not asyncio.run(once(turns)):
                break
            mid_stop += 1
        gc.collect()
    assert mid_stop >= 2
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


async def _start_fails() -> None:
    raise RuntimeError("no broker")


def test_a_cancellation_while_a_failed_start_closes_wins_over_its_error() -> None:
    """A caller retrying failed starts (a retryable error) must not retry once cancelled: a
    cancellation that arrives while the failed start's client closes is what the caller gets,
    and the close still ends."""

    async def main() -> None:
        closing, closed = asyncio.Event(), asyncio.Event()

        async def slow_close() -> None:
            closing.set()
            await asyncio.sleep(0.05)
            closed.set()

        task = asyncio.create_task(start_client(_start_fails, slow_close))
        await closing.wait()
        task.cancel()
        (result,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(result, asyncio.CancelledError), result
        assert closed.is_set()

        # Not cancelled, the start's own error is raised.
        with pytest.raises(RuntimeError, match="no broker"):
            await start_client(_start_fails, slow_close)

    asyncio.run(main())


def test_a_stop_that_ends_cancelled_by_itself_returns() -> None:
    """aiokafka's stop of a client whose start never ended can re-raise that start's
    cancellation: the caller, not cancelled itself, goes on."""

    async def main() -> None:
        async def stop_reraising() -> None:
            await asyncio.sleep(0)
            raise asyncio.CancelledError

        await stop_client(stop_reraising)  # returns
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(main())
