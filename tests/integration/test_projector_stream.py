"""The projector's stream waits for an event before it times a batch
(services/projector/stream.py).

``take_events`` calls ``wait_for_stopped(buffer_full, timeout=within)`` once a turn, with its
buffer's processor among the stream's processors: these tests make those calls as it does and
run the stream's processors on a value as faust does for each event. The projector's own
suites (``test_projector_app`` and the rest) run it under faust's ``take_events`` against the
real broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import faust
import pytest

from services.projector.stream import QuietStream

WITHIN = 0.05


@pytest.fixture
async def stream() -> AsyncIterator[Any]:
    app = faust.App("quiet-stream-test", broker="memory://", Stream=QuietStream,
                    web_enabled=False, autodiscover=False)
    s = app.stream(None)
    assert isinstance(s, QuietStream)
    await s.maybe_start()
    yield s
    await s.stop()


def _arrive(stream: Any, value: object) -> None:
    """An event reaching the stream: its processors run on the value, in order."""
    for processor in list(stream._processors):
        value = processor(value)


async def _returns_within(wait: asyncio.Task[bool], seconds: float) -> bool:
    done, _ = await asyncio.wait([wait], timeout=seconds)
    return bool(done)


async def test_with_nothing_arriving_a_timed_wait_does_not_return(stream: Any) -> None:
    full = asyncio.Event()
    wait = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    assert not await _returns_within(wait, 10 * WITHIN)  # faust's own: back after WITHIN
    wait.cancel()


async def test_a_batch_gets_its_whole_wait_from_its_first_event(stream: Any) -> None:
    full = asyncio.Event()
    wait = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    await asyncio.sleep(3 * WITHIN)
    arrived = time.monotonic()
    _arrive(stream, "first")
    assert await _returns_within(wait, 20 * WITHIN)  # (mode's result for a timeout is True)
    assert time.monotonic() - arrived >= 0.9 * WITHIN
    # Nothing since: the next turn waits for an event again.
    again = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    assert not await _returns_within(again, 5 * WITHIN)
    _arrive(stream, "second")
    assert await _returns_within(again, 20 * WITHIN)


async def test_a_full_buffer_ends_the_wait_at_once(stream: Any) -> None:
    full = asyncio.Event()
    wait = asyncio.create_task(stream.wait_for_stopped(full, timeout=60))
    await asyncio.sleep(0.01)
    _arrive(stream, "first")
    full.set()  # as take_events' processor does at its max
    assert await _returns_within(wait, 5)
    assert wait.result() is False


async def test_an_event_that_came_during_the_hand_out_starts_the_next_batch(
        stream: Any) -> None:
    full = asyncio.Event()
    first = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    await asyncio.sleep(0.01)
    _arrive(stream, "a")
    assert await _returns_within(first, 20 * WITHIN)
    _arrive(stream, "b")  # while take_events hands the batch out: the next batch's
    nxt = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    assert await _returns_within(nxt, 20 * WITHIN)  # timed at once, no event needed


async def test_stopping_ends_a_wait_for_the_first_event(stream: Any) -> None:
    full = asyncio.Event()
    wait = asyncio.create_task(stream.wait_for_stopped(full, timeout=WITHIN))
    await asyncio.sleep(2 * WITHIN)
    await stream.stop()
    assert await _returns_within(wait, 5)
    assert wait.result() is True


async def test_waits_without_a_timeout_are_modes_own(stream: Any) -> None:
    ready = asyncio.Event()
    ready.set()
    assert await stream.wait_for_stopped(ready) is False  # no event needed, no processor
    assert not stream._processors
