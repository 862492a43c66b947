"""The projector's consumer thread runs every seek itself (services/projector/transport.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from faust.types import TP

from services.projector.transport import _ConsumerThread

TP0, TP1 = TP("t", 0), TP("t", 1)


class _Consumer:
    """aiokafka's consumer as the thread sees it: records which thread each seek ran on."""

    def __init__(self) -> None:
        self.seeks: list[tuple[TP, int, str]] = []

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset, threading.current_thread().name))


def _thread(loop: asyncio.AbstractEventLoop, consumer: _Consumer) -> Any:
    """A consumer thread with only what seeking uses (faust's own needs a whole app)."""
    t = _ConsumerThread.__new__(_ConsumerThread)
    t.thread_loop = loop
    t._consumer = consumer
    t._sought, t._unsought, t._next = {}, {TP0, TP1}, {}
    t._gaps = type("Gaps", (), {"forget": lambda self, tp: None})()
    return t


def test_a_seek_from_another_thread_runs_on_the_consumers_thread_in_order() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="consumer-thread")
    runner.start()
    try:
        consumer = _Consumer()
        t = _thread(loop, consumer)
        t.seek(TP0, 5)
        t.seek(TP1, 7)
        t.seek(TP0, 9)
        done = threading.Event()
        loop.call_soon_threadsafe(done.set)  # after every seek asked before it
        assert done.wait(5)
        assert consumer.seeks == [(TP0, 5, "consumer-thread"), (TP1, 7, "consumer-thread"),
                                  (TP0, 9, "consumer-thread")]
        assert t._sought == {TP0: 9, TP1: 7} and not t._unsought
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def test_a_seek_on_the_consumers_thread_runs_at_once() -> None:
    loop = asyncio.new_event_loop()
    consumer = _Consumer()
    t = _thread(loop, consumer)

    async def seek_here() -> list[tuple[TP, int, str]]:
        t.seek(TP1, 3)
        return list(consumer.seeks)  # before the loop turns again

    assert loop.run_until_complete(seek_here()) == [
        (TP1, 3, threading.current_thread().name)]
    loop.close()
