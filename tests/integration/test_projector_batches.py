"""The projector's batches: taken when full or ``within_s`` after their first item, and no
wake while nothing arrives. The faust glue is exercised by every projector test."""

from __future__ import annotations

import asyncio

import pytest

from services.projector.batches import Batches


async def _taken_within(batches: Batches[int], seconds: float) -> list[int] | None:
    """The next batch, taken and released, if it is ready within ``seconds``."""
    try:
        await asyncio.wait_for(batches.ready(), seconds)
    except TimeoutError:
        return None
    batch = batches.take()
    batches.release()
    return batch


async def test_nothing_is_ready_while_nothing_arrives() -> None:
    batches: Batches[int] = Batches(10, within_s=0.01)
    assert await _taken_within(batches, 0.1) is None  # ten periods of the old timer
    assert batches.take() == []
    batches.release()


async def test_a_batch_is_taken_within_its_time_from_its_first_item() -> None:
    batches: Batches[int] = Batches(10, within_s=0.05)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.2)  # idle time before the first item does not count
    started = loop.time()
    await batches.add(1)
    await batches.add(2)
    assert await _taken_within(batches, 0.02) is None  # not yet: its time runs from item 1
    assert await _taken_within(batches, 1.0) == [1, 2]
    assert 0.045 <= loop.time() - started < 0.5


async def test_a_full_batch_is_ready_at_once_and_the_next_add_waits_for_room() -> None:
    batches: Batches[int] = Batches(3, within_s=10.0)
    for i in range(3):
        await batches.add(i)
    fourth = asyncio.create_task(batches.add(3))
    assert await _taken_within(batches, 0.5) == [0, 1, 2]
    await asyncio.wait_for(fourth, 0.5)  # room again once the batch is taken
    assert batches.pending == 1
    assert await _taken_within(batches, 0.02) is None  # the new batch's own clock
    assert batches.pending == 1


async def test_the_next_batch_starts_its_clock_at_its_own_first_item() -> None:
    batches: Batches[int] = Batches(100, within_s=0.05)
    await batches.add(1)
    assert await _taken_within(batches, 1.0) == [1]
    await asyncio.sleep(0.1)
    assert await _taken_within(batches, 0.02) is None
    await batches.add(2)
    assert await _taken_within(batches, 1.0) == [2]


async def test_no_wait_takes_each_item_at_once() -> None:
    batches: Batches[str] = Batches(100, within_s=0.0)
    await batches.add("a")
    assert await _taken_within(batches, 0.01) == ["a"]


def test_a_batch_holds_at_least_one_item() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        Batches(0, within_s=0.01)


async def test_nothing_is_added_while_a_taken_batch_is_applied() -> None:
    """A reader must not run a second batch ahead while one is applied (bunches of jobs are
    hundreds of KB each): what arrives then waits in the stream's bounded read-ahead."""
    batches: Batches[int] = Batches(100, within_s=0.0)
    await batches.add(1)
    await asyncio.wait_for(batches.ready(), 0.5)
    assert batches.take() == [1]
    second = asyncio.create_task(batches.add(2))
    await asyncio.sleep(0.05)
    assert not second.done() and batches.pending == 0
    batches.release()
    await asyncio.wait_for(second, 0.5)
    assert await _taken_within(batches, 0.5) == [2]
