"""gc_paused: the collector is off while any pause is open, and restored as it was."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from services.common.gcpause import SERVICE_GC_THRESHOLDS, gc_paused, tune_for_service


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_a_pause_turns_the_collector_off_and_back_on() -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause is still open
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_error_in_the_body_still_restores_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_overlapping_pauses_of_interleaved_tasks() -> None:
    """Lane A opens first and closes first; the collector stays off until B closes."""
    gc.enable()
    seen: list[tuple[str, bool]] = []

    async def lane(name: str, opened: asyncio.Event, close: asyncio.Event) -> None:
        with gc_paused():
            opened.set()
            await close.wait()
        seen.append((name, gc.isenabled()))

    async def main() -> None:
        a_open, b_open, a_close, b_close = (asyncio.Event() for _ in range(4))
        a = asyncio.create_task(lane("a", a_open, a_close))
        await a_open.wait()
        b = asyncio.create_task(lane("b", b_open, b_close))
        await b_open.wait()
        a_close.set()
        await a
        b_close.set()
        await b

    asyncio.run(main())
    assert seen == [("a", False), ("b", True)]


def test_a_service_freezes_what_start_up_made_and_collects_less_often() -> None:
    thresholds = gc.get_threshold()
    gc.enable()
    try:
        tune_for_service()
        assert gc.get_threshold() == SERVICE_GC_THRESHOLDS
        assert SERVICE_GC_THRESHOLDS[0] > thresholds[0]
        assert gc.get_freeze_count() > 0  # the imports' objects are out of the collector's way
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
