"""Reading spans of single partitions, as audits need: ``[start, end)`` of one partition at a time.

:class:`services.common.log.LogConsumer` reads every partition of its topics; an audit reads one
batch's partition (history) or replays partitions one after the other (rebuild), so it assigns
one partition at a time to a group-less consumer that never commits. A key's partition is the
one the producers' default partitioner (murmur2, as in the Java client) chose.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from core.log_gaps import GapGuard
from services.common.log import LogError, start_client, stop_client
from services.common.settings import LogSettings


def partition_for(key: bytes, n_partitions: int) -> int:
    """The partition the default partitioner gives ``key`` among ``n_partitions``."""
    return int(murmur2(key) & 0x7FFFFFFF) % n_partitions


FETCH_WAIT_MS = 10
"""How long the broker may hold a fetch that finds nothing. A span is read only up to where
the log already was, so waiting for new records is never useful here; and the consumer sends
a new fetch of a partition as soon as it has read to its end, which a reader moving on to the
next partition then waited out (aiokafka's default 500 ms, a second of a 6 s replay)."""


class PartitionReader:
    """Reads spans of single partitions with one group-less consumer. An async context manager."""

    def __init__(self, settings: LogSettings, *, max_records: int = 10_000,
                 stall_timeout_s: float = 30.0) -> None:
        self._settings = settings
        self._max_records = max_records
        self._stall_timeout_s = stall_timeout_s
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        s = self._settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers, client_id=f"{s.client_id}-audit",
            request_timeout_ms=s.request_timeout_ms, enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024, isolation_level="read_uncommitted",
            fetch_max_wait_ms=FETCH_WAIT_MS)
        try:
            await start_client(consumer.start, consumer.stop)
        except KafkaError as e:
            raise LogError(f"starting the audit consumer: {e!r}", retryable=True) from e
        # Let aiokafka's no-group coordinator start its task: stopping the consumer before that
        # task first ran re-raises the task's cancellation from stop().
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:  # no __aexit__ follows a failed __aenter__
            await asyncio.gather(consumer.stop(), return_exceptions=True)
            raise
        self._consumer = consumer
        return self

    async def __aexit__(self, *exc: object) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_client(consumer.stop)

    def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise LogError("the reader is not started", retryable=False)
        return self._consumer

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of a logical topic (empty if it does not exist)."""
        # A fresh full metadata request: the consumer's cached metadata only keeps the topics
        # it has assigned since, so another topic may be missing from it.
        metadata = await self._started()._client.fetch_all_metadata()
        return sorted(metadata.partitions_for_topic(self._settings.topic(topic)) or ())

    async def read(self, topic: str, partition: int, start: int, end: int
                   ) -> AsyncIterator[list[Any]]:
        """Yield the records of ``topic[partition]`` with offsets in ``[start, end)``, in order.

        Records are aiokafka ``ConsumerRecord``s (offset, key, value). Raises
        :class:`LogError` when the partition stops delivering before ``end``.
        """
        if end <= start:
            return
        consumer = self._started()
        tp = TopicPartition(self._settings.topic(topic), partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        gaps: GapGuard[TopicPartition] = GapGuard()
        last_progress = time.monotonic()
        try:
            while position < end:
                fetched = await consumer.getmany(tp, timeout_ms=500,
                                                 max_records=self._max_records)
                batch = [m for m in fetched.get(tp, []) if position <= m.offset < end]
                # Records past a hole wait until it fills (core.log_gaps).
                admitted = gaps.admit(tp, position, [m.offset for m in batch], time.monotonic())
                if admitted.seek_to is not None:
                    consumer.seek(tp, admitted.seek_to)
                batch = batch[:admitted.count]
                if batch:
                    position = batch[-1].offset + 1
                    last_progress = time.monotonic()
                    yield batch
                    continue
                position = max(position, await consumer.position(tp))
                if position < end and time.monotonic() - last_progress > self._stall_timeout_s:
                    raise LogError(f"{topic}[{partition}] delivered nothing past offset "
                                   f"{position} for {self._stall_timeout_s:.0f} s; expected "
                                   f"records up to {end}", retryable=True)
        except KafkaError as e:
            raise LogError(f"reading {topic}[{partition}]: {e!r}", retryable=True) from e
