"""gc_paused: the collector is off while any pause is open, and restored as it was."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from services.common.gcpause import (
    SERVICE_GC_THRESHOLDS,
    gc_paused,
    pause,
    resume,
    tune_for_service,
)


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


def test_a_pause_handed_to_another_thread_ends_there() -> None:
    """A bulk lane opens a pause for its rows and its writing thread resumes it."""
    gc.enable()
    pause()
    handed = threading.Thread(target=resume)
    with gc_paused():
        handed.start()
        handed.join()
        assert not gc.isenabled()  # this thread's own pause is still open
    assert gc.isenabled()


def test_pauses_of_many_threads_at_once_leave_the_collector_as_it_was() -> None:
    """Opening and closing is one step under a lock: threads switching at every few
    instructions never leave the collector off, nor turn it on inside a pause."""
    gc.enable()
    inside_on: list[int] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def churn() -> None:
        for _ in range(20_000):
            with gc_paused():
                if gc.isenabled():
                    inside_on.append(1)

    try:
        threads = [threading.Thread(target=churn) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert gc.isenabled()
    assert inside_on == []


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
