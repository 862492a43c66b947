"""Reading spans of single partitions, as audits need: ``[start, end)`` of one partition at a time.

:class:`services.common.log.LogConsumer` reads every partition of its topics; an audit reads one
batch's partition (history) or replays partitions one after the other (rebuild). It needs no
group, no committed offsets and no prefetching, so it sends its own fetch requests through
aiokafka's client and takes the records of each record batch as aiokafka's record decoder (in C)
yields them. A consumer would wrap each in a ``ConsumerRecord`` of eleven fields (copying its
headers into a tuple) through a generator: 2 of the 2.8 us per event a replay lane spent
reading the log (measured on 304,078 events: 2.8 us with a consumer, 0.8 with these fetches),
a sixth of the lane's CPU. A key's partition is the one the producers' default partitioner
(murmur2, as in the Java client) chose.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Self

from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords

from core.log_gaps import GapGuard
from services.common.log import LogError, start_client, stop_client
from services.common.settings import LogSettings


def partition_for(key: bytes, n_partitions: int) -> int:
    """The partition the default partitioner gives ``key`` among ``n_partitions``."""
    return int(murmur2(key) & 0x7FFFFFFF) % n_partitions


FETCH_WAIT_MS = 10
"""How long the broker may hold a fetch that finds nothing. A span is read only up to where
the log already was, so waiting for new records is never useful here (a consumer's default,
500 ms, was a second of a 6 s replay)."""

PARTITION_FETCH_BYTES = 16 * 1024 * 1024
"""The most one fetch asks of a partition (the broker still returns a first record batch
larger than this whole)."""

RETRY_S = 0.1
"""How long to wait before fetching again after a retriable error or while a hole fills."""


class PartitionReader:
    """Reads spans of single partitions through one client of its own. An async context manager."""

    def __init__(self, settings: LogSettings, *, max_records: int = 10_000,
                 stall_timeout_s: float = 30.0) -> None:
        self._settings = settings
        self._max_records = max_records
        self._stall_timeout_s = stall_timeout_s
        self._client: AIOKafkaClient | None = None
        self._leaders: dict[tuple[str, int], int] = {}

    async def __aenter__(self) -> Self:
        s = self._settings
        client = AIOKafkaClient(bootstrap_servers=s.bootstrap_servers,
                                client_id=f"{s.client_id}-audit",
                                request_timeout_ms=s.request_timeout_ms)
        try:
            await start_client(client.bootstrap, client.close)
        except KafkaError as e:
            raise LogError(f"starting the audit client: {e!r}", retryable=True) from e
        self._client = client
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            await stop_client(client.close)

    def _started(self) -> AIOKafkaClient:
        if self._client is None:
            raise LogError("the reader is not started", retryable=False)
        return self._client

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of a logical topic (empty if it does not exist)."""
        metadata = await self._started().fetch_all_metadata()
        return sorted(metadata.partitions_for_topic(self._settings.topic(topic)) or ())

    async def _leader(self, topic: str, partition: int) -> int:
        """The broker leading ``topic[partition]`` (a physical topic), from metadata fetched
        when none is known (at first, and after an error dropped what was)."""
        node = self._leaders.get((topic, partition))
        if node is None:
            metadata = await self._started().fetch_all_metadata()
            self._leaders = {
                (t, p): leader for t in metadata.topics()
                for p in metadata.partitions_for_topic(t) or ()
                if (leader := metadata.leader_for_partition(TopicPartition(t, p))) is not None
                and leader >= 0}
            node = self._leaders.get((topic, partition))
        if node is None:
            raise Refetch(f"{topic}[{partition}] has no leader", stale_leader=True)
        return node

    async def read(self, topic: str, partition: int, start: int, end: int
                   ) -> AsyncIterator[list[Any]]:
        """Yield the records of ``topic[partition]`` with offsets in ``[start, end)``, in order,
        a list of at most about ``max_records`` (one fetch's worth) at a time.

        Records are aiokafka's (``offset``, ``key``, ``value``, ``timestamp``, ``headers``).
        Raises :class:`LogError` when the partition stops delivering before ``end``, and when
        records of the span are no longer in the log (deleted by retention).
        """
        if end <= start:
            return
        client = self._started()
        physical = self._settings.topic(topic)
        position = start
        gaps: GapGuard[int] = GapGuard()
        last_progress = time.monotonic()
        try:
            while position < end:
                was = position
                try:
                    node = await self._leader(physical, partition)
                    data = await _fetch(client, node, physical, partition, position)
                    records, position = take_span(data, position, end, gaps)
                    if position == was:
                        raise Refetch("the fetch returned no records")
                except Refetch as retry:
                    if retry.stale_leader:
                        self._leaders.clear()
                    if time.monotonic() - last_progress > self._stall_timeout_s:
                        raise LogError(f"{topic}[{partition}] delivered nothing past offset "
                                       f"{position} for {self._stall_timeout_s:.0f} s; "
                                       f"expected records up to {end} ({retry})",
                                       retryable=True) from None
                    await asyncio.sleep(RETRY_S)
                    continue
                last_progress = time.monotonic()
                step = self._max_records
                for i in range(0, len(records), step):
                    yield records if len(records) <= step else records[i:i + step]
        except KafkaError as e:
            raise LogError(f"reading {topic}[{partition}]: {e!r}", retryable=True) from e


class Refetch(Exception):
    """A fetch to send again: a retriable error, or records not readable yet."""

    def __init__(self, reason: str, *, stale_leader: bool = False) -> None:
        super().__init__(reason)
        self.stale_leader = stale_leader
        """The error says the leader known may no longer be the partition's."""


async def _fetch(client: AIOKafkaClient, node: int, topic: str, partition: int,
                 offset: int) -> bytes:
    """The record batches one fetch of ``topic[partition]`` from ``offset`` returns."""
    request = FetchRequest(FETCH_WAIT_MS, 1, PARTITION_FETCH_BYTES, READ_UNCOMMITTED,
                           [(topic, [(partition, offset, PARTITION_FETCH_BYTES)])])
    try:
        response = await client.send(node, request)
    except KafkaError as e:
        if e.retriable:
            raise Refetch(repr(e), stale_leader=True) from None
        raise
    for name, parts in response.topics:
        for number, code, _highwater, *rest in parts:
            if (name, number) != (topic, partition):
                continue
            error = kafka_errors.for_code(code)
            if error is kafka_errors.NoError:
                return bytes(rest[-1] or b"")
            if error is kafka_errors.OffsetOutOfRangeError:
                raise LogError(f"{topic}[{partition}] has no offset {offset} any more: its "
                               f"records were deleted (retention) or the log was truncated",
                               retryable=False)
            if error.retriable:
                raise Refetch(error.__name__, stale_leader=True)
            raise LogError(f"fetching {topic}[{partition}] from offset {offset}: "
                           f"{error.__name__}", retryable=False)
    raise Refetch("the fetch response did not include the partition")


READ_UNCOMMITTED = 0
"""The isolation level fetched at: every record written, as the projector's consumer reads."""


def take_span(data: bytes, position: int, end: int, gaps: GapGuard[int]
          ) -> tuple[list[Any], int]:
    """The records of fetched ``data`` from ``position`` (up to ``end``), and the position
    after them.

    Record batches that start before ``position`` (a fetch returns whole batches) are cut to
    it; control batches (transaction markers) are stepped over. A batch that starts past
    ``position`` leaves a hole, which is waited out (:mod:`core.log_gaps`): what came before
    it is taken, and the next fetch starts at the hole.
    """
    out: list[Any] = []
    batches = MemoryRecords(data)
    while batches.has_next():
        batch = batches.next_batch()
        if batch.next_offset <= position:
            continue
        if not batch.validate_crc():
            raise Refetch("a record batch failed its CRC check")
        if getattr(batch, "is_control_batch", False):
            position = batch.next_offset
            continue
        records = list(batch)
        if not records:  # compacted away
            position = batch.next_offset
            continue
        first = records[0].offset
        if first > position:
            admitted = gaps.admit(0, position, [first], time.monotonic())
            if admitted.count == 0:
                if out:
                    return out, position
                raise Refetch(f"offsets from {position} to {first - 1} are not readable yet")
        elif first < position:
            records = [r for r in records if r.offset >= position]
        if records[-1].offset >= end:
            out += [r for r in records if r.offset < end]
            return out, end
        out += records
        position = batch.next_offset
    return out, position
