"""faust's aiokafka transport, with the consumer's fetch wait taken from our settings.

faust-streaming 0.15.3 creates its worker consumer with ``fetch_max_wait_ms=1500`` and no
setting to change it. Against Kafka that costs nothing: the broker answers a waiting fetch as
soon as records arrive. The local broker (tansu) does not: it answers when the wait is over, so
every event reached the projector up to 1.5 s late, and so did every read-your-writes answer
that waited for it. The projector sets ``LogSettings.fetch_max_wait_ms`` here instead.

The consumer also holds back records fetched past a hole in a partition's offsets and fetches
the hole again (:mod:`core.log_gaps`): the local broker can serve a later record batch before an
earlier one is readable, and faust would go on past it, so the projection would miss records.

A newly assigned partition delivers nothing until it is sought: the projector seeks each one to
the offset stored with the projection, and records fetched before that, from wherever the group
left the partition, reached the agent after the seek and were applied (seen: a restart applied
the records after one that had stopped the projector, because faust had committed past it).
An app on this transport must seek every partition it is assigned.

faust seeks every assigned partition to the group's committed offset too, in its recovery, and
that seek may end after the app's (it awaits the broker; the app's handler awaits the database):
it then moved the position, and faust's own read offset, past what the projection applied, and
faust dropped every record it read below that offset. A restart after a record that stopped the
projector sat idle past it (seen under CI's load). The app's seek wins: faust's seek to the
committed offsets puts every partition the app has sought back where the app sought it.

The consumer lives on faust's consumer thread, and aiokafka is not thread-safe, but faust seeks
from the app's loop (``Consumer.seek`` calls the thread's ``seek`` there). A seek drops the
records the fetcher holds for the partition, and one that ran while the consumer thread was
handing those records out crashed the projector (``KeyError`` in aiokafka's
``fetched_records``: every time it started behind a backlog, in ``bench/catchup.py``). Seeks
and the bookkeeping that goes with them run on the consumer thread's loop, in the order asked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from core.log_gaps import GapGuard

log = logging.getLogger(__name__)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gaps: GapGuard[TP] = GapGuard()
        self._next: dict[TP, int] = {}  # after the last record handed to faust, per partition
        self._unsought: set[TP] = set()  # assigned, and not sought since: deliver nothing
        self._sought: dict[TP, int] = {}  # where the app sought each partition since assigned

    async def _fetch_records(self, consumer: Any, active_partitions: Any,
                             timeout: float | None = None,  # noqa: ASYNC109 (faust's signature)
                             max_records: int | None = None) -> Any:
        fetched = dict(await super()._fetch_records(consumer, active_partitions,
                                                    timeout=timeout, max_records=max_records))
        now = time.monotonic()
        for tp, records in list(fetched.items()):
            if tp in self._unsought:
                del fetched[tp]  # the seek that comes moves the position back to its own
                continue
            admitted = self._gaps.admit(tp, self._next.get(tp), [r.offset for r in records],
                                        now)
            if admitted.accepted is not None:
                log.warning("%s[%d]: offsets %d-%d never became readable; skipped", tp.topic,
                            tp.partition, admitted.accepted[0], admitted.accepted[1] - 1)
            if admitted.seek_to is not None:
                consumer.seek(tp, admitted.seek_to)  # drops what aiokafka holds past it
            if admitted.count < len(records):
                fetched[tp] = records = records[:admitted.count]
            if records:
                self._next[tp] = records[-1].offset + 1
        return fetched

    def seek(self, partition: TP, offset: int) -> None:
        self._on_thread(self._seek_here, partition, offset)

    def _seek_here(self, partition: TP, offset: int) -> None:
        self._sought[partition] = offset
        self._moved(partition, offset)
        super().seek(partition, offset)

    def _on_thread(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn`` on the consumer thread: now if this is it, else as soon as its loop
        turns (before anything ``call_thread`` queues after this call)."""
        try:
            here = asyncio.get_running_loop() is self.thread_loop
        except RuntimeError:
            here = False
        if here or not self.thread_loop.is_running():
            fn(*args)
        else:
            self.thread_loop.call_soon_threadsafe(fn, *args)

    async def seek_to_committed(self) -> Any:
        # faust's recovery; the app may seek before it, or while it awaits the broker.
        committed = dict(await super().seek_to_committed())

        async def app_wins() -> None:
            for tp, offset in list(self._sought.items()):
                if tp in committed:
                    self._ensure_consumer().seek(tp, offset)
                    self._moved(tp, offset)
                    committed[tp] = offset

        await self.call_thread(app_wins)
        return committed

    async def _seek_wait(self, consumer: Any, partitions: Any) -> None:
        for tp, offset in partitions.items():
            self._moved(tp, offset)
        await super()._seek_wait(consumer, partitions)

    async def on_partitions_assigned(self, assigned: Any, generation: int = 0) -> None:
        # Positions come from wherever the group left them: nothing is delivered until the
        # projector seeks each partition to its stored offset; from there on, the first
        # record is taken as it comes.
        self._next.clear()
        self._gaps = GapGuard()
        self._unsought = set(assigned)
        self._sought = {}
        await super().on_partitions_assigned(assigned, generation)

    def _moved(self, tp: TP, offset: int) -> None:
        self._unsought.discard(tp)
        self._next[tp] = offset
        self._gaps.forget(tp)

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this attribute when the consumer starts (it is not started yet).
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise RuntimeError("aiokafka's consumer no longer has _fetch_max_wait_ms: "
                               "revisit services/projector/transport.py")
        consumer._fetch_max_wait_ms = self.app.conf.hs_fetch_max_wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with :class:`_Consumer`."""

    Consumer = _Consumer


def use_transport(app: faust.App, fetch_max_wait_ms: int) -> None:
    """Make ``app`` consume through :class:`Transport` with this fetch wait (call before the
    app first touches its transport)."""
    app.conf.hs_fetch_max_wait_ms = fetch_max_wait_ms
    app.transport = Transport(app.conf.broker_consumer, app)
