"""The log adapter: the system's only door to Kafka (aiokafka underneath).

- :func:`bootstrap_topics` creates the topics with the configured partition count.
- :class:`Publisher` appends envelopes with ``acks=all`` and returns where each landed; batched
  publishing lets aiokafka pack many records per request (tansu and Kafka both prefer that).
- :class:`LogConsumer` reads envelopes in batches. Its position is *not* Kafka's committed
  offset but the one stored in the projection database with the rows it produced
  (:mod:`services.common.offsets`), so a restart or a rebalance resumes exactly there.
- :func:`high_watermarks` reads partition ends from fetch responses, because ListOffsets
  (``end_offsets()``) is wrong on the local broker.

Events are keyed by their partition key (the batch id for batch events), so Kafka's default
murmur2 partitioner keeps each batch's events in one partition, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from core.log_gaps import GapGuard
from schemas import codec
from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from services.common.settings import ALL_TOPICS, LogSettings

log = logging.getLogger(__name__)
_probing: contextvars.ContextVar[bool] = contextvars.ContextVar("hs_probing", default=False)


class _QuietProbes(logging.Filter):
    """Drops aiokafka's INFO lines about the assignment of a :func:`high_watermarks` consumer.

    The projector's lag probe makes one every few seconds, and each logged its topics as a
    table: eight lines every five seconds that buried everything else in the projector's log
    (a CI failure's excerpt showed nothing but them). Only the probe's own task is quieted
    (a context variable): a group consumer's assignments, in any other task or thread, are
    still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not _probing.get()


logging.getLogger("aiokafka.consumer.subscription_state").addFilter(_QuietProbes())
_FIRST = -1
"""``LogConsumer._next`` of a partition read from its beginning: whatever offset comes first."""


class LogError(Exception):
    """The log could not do what was asked. ``retryable`` tells callers whether to try again."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def _classify(e: KafkaError, what: str) -> LogError:
    retryable = bool(getattr(e, "retriable", False)) or isinstance(e, KafkaConnectionError)
    return LogError(f"{what}: {type(e).__name__}: {e}", retryable=retryable)


START_GRACE_S = 5.0
"""How long a cancelled :func:`start_client` lets the start go on, so that closing finds every
connection it opened."""


async def start_client(start: Callable[[], Awaitable[None]],
                       close: Callable[[], Awaitable[None]]) -> None:
    """Start an aiokafka client such that no connection outlives a start that fails or is
    cancelled.

    aiokafka's bootstrap keeps the connection it is asking for metadata on in a local variable:
    cancelled then, the connection is never closed (seen in CI as an unclosed socket, when a
    replay was stopped while a lane's reader was starting). So the start runs shielded; on
    cancellation it may go on for up to :data:`START_GRACE_S` (a reachable broker answers in
    milliseconds), then the client is closed and the cancellation re-raised. A start that fails
    closes the client before its error is raised.
    """
    task = asyncio.ensure_future(start())
    try:
        await asyncio.shield(task)
    except BaseException:
        try:
            if not task.done():  # cancelled
                await asyncio.wait({task}, timeout=START_GRACE_S)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its error is the one raised
            # The error worth raising is the one that stopped the start, unless the caller is
            # cancelled while the client closes: then the cancellation (a caller retrying a
            # failed start must not retry after being cancelled).
            with contextlib.suppress(Exception):
                await stop_client(close)
        raise


STOP_GRACE_S = 10.0
"""How long a cancelled :func:`stop_client` waits for the stop to end before it stops waiting."""


async def stop_client(stop: Callable[[], Awaitable[None]]) -> None:
    """Stop (close) an aiokafka client without losing a cancellation of the caller.

    aiokafka's client close cancels its metadata task and awaits it under
    ``suppress(CancelledError)``. A caller cancelled while it waits there has its *own*
    cancellation suppressed and carries on as if nothing happened: a cancelled
    :func:`bootstrap_topics` returned normally, and the task that should have ended slept on
    (a hang seen once in CI, reproduced in a minute of cancelled bootstraps). So the stop runs
    as a task of its own, awaited through a shield: the caller's cancellation reaches the
    caller, after the stop has been given up to :data:`STOP_GRACE_S` to close the connections.
    The stop's own error, if any, is the one raised when the caller was not cancelled; a stop
    that ends cancelled by itself (aiokafka re-raises the cancellation of a start that never
    ended) has closed what it could, and returns.
    """
    task = asyncio.ensure_future(stop())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if task.done() and task.cancelled() and (me is None or not me.cancelling()):
            return  # the stop's own cancellation, not the caller's
        if not task.done():
            await asyncio.wait({task}, timeout=STOP_GRACE_S)
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved: the cancellation is what is raised
        else:
            task.cancel()
        raise


class LogPosition(NamedTuple):
    """Where a record landed (or was read from). ``topic`` is the logical name."""

    topic: str
    partition: int
    offset: int


class Record(NamedTuple):
    """An envelope read from the log, with its position."""

    topic: str
    partition: int
    offset: int
    envelope: Envelope


def _common(settings: LogSettings) -> dict[str, Any]:
    return {"bootstrap_servers": settings.bootstrap_servers, "client_id": settings.client_id,
            "request_timeout_ms": settings.request_timeout_ms}


TOPICS_READY_TIMEOUT_S = 30.0
"""How long :func:`bootstrap_topics` waits for topics it created to be usable."""


def unready_topics(described: Iterable[Mapping[str, Any]], partitions: int) -> list[str]:
    """The topics of a DescribeTopics answer that are not usable yet: an error (not known to
    the broker answering, say), fewer than ``partitions`` partitions, or one with no leader."""
    out = []
    for d in described:
        parts = d.get("partitions") or []
        if (d.get("error_code") or len(parts) < partitions
                or any(p.get("error_code") or p.get("leader", -1) < 0 for p in parts)):
            out.append(str(d.get("topic")))
    return out


async def bootstrap_topics(settings: LogSettings, topics: Iterable[str] = ALL_TOPICS) -> list[str]:
    """Create the (logical) ``topics`` that do not exist yet; return those created, once every
    partition of each has a leader.

    Existing topics are left as they are: changing a topic's partition count would move keys
    between partitions and break per-batch ordering. Kafka answers CreateTopics before every
    broker knows the new topics; a consumer that subscribed meanwhile could be assigned none of
    their partitions until its next metadata refresh (minutes), so this waits (bounded by
    :data:`TOPICS_READY_TIMEOUT_S`) until the topics are described whole.
    """
    admin = AIOKafkaAdminClient(**_common(settings))
    await start_client(admin.start, admin.close)
    try:
        existing = set(await admin.list_topics())
        wanted = [settings.topic(t) for t in topics]
        missing = [t for t in wanted if t not in existing]
        if missing:
            # Another starter may win the race; the topics then exist, which is what we want.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([
                    NewTopic(t, settings.partitions, settings.replication_factor)
                    for t in missing
                ])
            deadline = time.monotonic() + TOPICS_READY_TIMEOUT_S
            while unready := unready_topics(await admin.describe_topics(missing),
                                            settings.partitions):
                if time.monotonic() > deadline:
                    raise LogError(f"topics {unready} were created but are not whole after "
                                   f"{TOPICS_READY_TIMEOUT_S:g} s (an error, fewer than "
                                   f"{settings.partitions} partitions, or a partition without "
                                   "a leader)", retryable=True)
                await asyncio.sleep(0.1)
        return missing
    except KafkaError as e:
        raise _classify(e, "bootstrapping topics") from e
    finally:
        await stop_client(admin.close)


async def delete_topics(settings: LogSettings, topics: Iterable[str]) -> None:
    """Delete the logical ``topics`` (benchmarks and tests clean up after themselves)."""
    admin = AIOKafkaAdminClient(**_common(settings))
    await start_client(admin.start, admin.close)
    try:
        await admin.delete_topics([settings.topic(t) for t in topics])
    except KafkaError as e:
        raise _classify(e, "deleting topics") from e
    finally:
        await stop_client(admin.close)


async def partitions_of(settings: LogSettings, topic: str) -> list[int]:
    """The partition numbers of a logical topic."""
    admin = AIOKafkaAdminClient(**_common(settings))
    await start_client(admin.start, admin.close)
    try:
        (desc,) = await admin.describe_topics([settings.topic(topic)])
        if desc["error_code"]:
            raise LogError(f"topic {topic!r}: error code {desc['error_code']}", retryable=False)
        return sorted(p["partition"] for p in desc["partitions"])
    finally:
        await stop_client(admin.close)


def new_event_id() -> str:
    """A fresh globally unique event id."""
    return uuid.uuid4().hex


def now_ms() -> int:
    """Wall-clock milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


class Publisher:
    """Appends events to the log with ``acks=all``. An async context manager.

    ``producer_epoch`` is stamped on every envelope: a scheduler passes the epoch it was elected
    with, so consumers can ignore a deposed scheduler. The clock and the id generator are
    injectable for tests.
    """

    def __init__(self, settings: LogSettings, *, producer_epoch: int = 0,
                 clock: Callable[[], int] = now_ms,
                 ids: Callable[[], str] = new_event_id) -> None:
        self._settings = settings
        self._epoch = producer_epoch
        self._clock = clock
        self._ids = ids
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._producer is not None:
            return
        s = self._settings
        producer = AIOKafkaProducer(
            **_common(s), acks="all", enable_idempotence=s.idempotent, linger_ms=s.linger_ms,
            max_batch_size=s.max_batch_size, max_request_size=s.max_request_size,
            compression_type=s.compression,
        )
        try:
            await start_client(producer.start, producer.stop)
        except KafkaError as e:
            raise _classify(e, "starting the producer") from e
        self._producer = producer

    async def stop(self) -> None:
        """Flush and close. Idempotent."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_client(producer.stop)

    def envelope(self, event: AnyEvent) -> Envelope:
        """Wrap ``event`` with a fresh id, the current time and this publisher's epoch."""
        return wrap(event, event_id=self._ids(), time_ms=self._clock(),
                    producer_epoch=self._epoch)

    async def publish(self, event: AnyEvent | Envelope, *, partition: int | None = None
                      ) -> LogPosition:
        """Append one event and wait until every in-sync replica has it."""
        (position,) = await self.publish_many([event], partition=partition)
        return position

    async def ends(self, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """The end offset (high watermark) of each partition of the logical ``topics``."""
        return await high_watermarks(self._settings, topics)

    async def publish_many(self, events: Sequence[AnyEvent | Envelope], *,
                           partition: int | None = None) -> list[LogPosition]:
        """Append events in order, letting the producer batch them; wait for all acks.

        Events with the same key keep their relative order. Returns positions in input order.
        """
        if self._producer is None:
            raise LogError("publisher is not started", retryable=False)
        try:
            futures = []
            for item in events:
                env = item if isinstance(item, Envelope) else self.envelope(item)
                futures.append(await self._producer.send(
                    self._settings.topic(env.topic), codec.encode(env),
                    key=env.key.encode(), partition=partition))
            metadata = await asyncio.gather(*futures)
        except KafkaError as e:
            raise _classify(e, "publishing") from e
        return [LogPosition(item.topic, m.partition, m.offset)
                for item, m in zip(events, metadata, strict=True)]


class OffsetStore(Protocol):
    """Where a consumer's positions live (the projection database, in production)."""

    def load(self, consumer: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        """The next offset to read of each (topic, partition) the consumer has applied."""
        ...


@dataclass
class ConsumerOptions:
    """How a :class:`LogConsumer` reads."""

    name: str
    """The consumer's identity: its Kafka group id and the owner of its stored offsets."""
    topics: Sequence[str]
    """Logical topics to read."""
    group: bool = True
    """Share partitions with other members of the group; otherwise read every partition."""
    max_records: int = 2000
    fetch_timeout_ms: int = 200
    heads: bool = False
    """Decode bunches of jobs without their specs (``codec.decode(..., heads=True)``)."""


class _SeekToStored(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: LogConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._owner._assigned -= set(revoked)
        for tp in revoked:
            self._owner._next.pop(tp, None)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._owner._seek(list(assigned))


class LogConsumer:
    """Reads envelopes in batches, resuming from offsets in an :class:`OffsetStore`.

    The consumer never commits offsets to Kafka: whoever applies a batch stores the next offsets
    in the same database transaction as its effects. On every (re)assignment the consumer seeks
    each partition to its stored offset (or the beginning), so nothing applied is read as new
    and nothing unapplied is skipped. Without a store it reads from the beginning (replay).
    """

    def __init__(self, settings: LogSettings, options: ConsumerOptions,
                 offsets: OffsetStore | None = None) -> None:
        self._settings = settings
        self._options = options
        self._offsets = offsets
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: set[TopicPartition] = set()
        # The next offset to deliver per partition. aiokafka keeps fetching while a rebalance
        # listener awaits, so records from before our seek can still arrive: they are dropped
        # here; records past a hole wait until it fills (core.log_gaps). So delivery is every
        # offset from the stored one, in order.
        self._next: dict[TopicPartition, int] = {}
        self._gaps: GapGuard[TopicPartition] = GapGuard()  # see core.log_gaps
        self._logical = {settings.topic(t): t for t in options.topics}

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        s, o = self._settings, self._options
        consumer = AIOKafkaConsumer(
            **_common(s), group_id=o.name if o.group else None, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms, max_poll_records=o.max_records,
            isolation_level="read_uncommitted", fetch_max_wait_ms=s.fetch_max_wait_ms,
        )
        try:
            await start_client(consumer.start, consumer.stop)
        except KafkaError as e:
            raise _classify(e, "starting the consumer") from e
        try:
            if o.group:
                consumer.subscribe(list(self._logical), listener=_SeekToStored(self))
            else:
                tps = []
                for physical in self._logical:
                    parts = consumer.partitions_for_topic(physical)
                    if parts is None:
                        await consumer._client.force_metadata_update()
                        parts = consumer.partitions_for_topic(physical) or set()
                    tps += [TopicPartition(physical, p) for p in sorted(parts)]
                consumer.assign(tps)
                self._consumer = consumer
                await self._seek(tps)
        except BaseException as e:  # a failed or cancelled seek too: no consumer left open
            self._consumer = None
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await consumer.stop()
            if isinstance(e, KafkaError):
                raise _classify(e, "starting the consumer") from e
            raise
        self._consumer = consumer

    async def stop(self) -> None:
        """Leave the group and close. Idempotent."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_client(consumer.stop)

    async def _seek(self, tps: list[TopicPartition]) -> None:
        consumer = self._consumer
        assert consumer is not None
        stored: Mapping[tuple[str, int], int] = {}
        if self._offsets is not None and tps:
            stored = await asyncio.to_thread(
                self._offsets.load, self._options.name, list(self._options.topics))
        for tp in tps:
            position = stored.get((self._logical[tp.topic], tp.partition))
            if position is None:
                await consumer.seek_to_beginning(tp)
                self._next[tp] = _FIRST  # the log may start past 0 (retention)
            else:
                consumer.seek(tp, position)
                self._next[tp] = position
            self._gaps.forget(tp)
        self._assigned |= set(tps)

    async def next_batch(self) -> list[Record]:
        """The next records (possibly none, after ``fetch_timeout_ms``), in offset order per
        partition. Raises :class:`schemas.codec.DecodeError` naming the bad record's position."""
        consumer = self._consumer
        if consumer is None:
            raise LogError("consumer is not started", retryable=False)
        try:
            fetched = await consumer.getmany(timeout_ms=self._options.fetch_timeout_ms,
                                             max_records=self._options.max_records)
        except KafkaError as e:
            raise _classify(e, "fetching") from e
        out: list[Record] = []
        now = time.monotonic()
        for tp, fetched_messages in fetched.items():
            topic = self._logical[tp.topic]
            expected = self._next.get(tp)
            if expected is None:
                continue  # no longer ours
            # Fetched before our seek: dropped. Past a hole: held back until it fills.
            messages = [m for m in fetched_messages if m.offset >= expected]
            admitted = self._gaps.admit(tp, None if expected == _FIRST else expected,
                                        [m.offset for m in messages], now)
            if admitted.seek_to is not None:
                consumer.seek(tp, admitted.seek_to)
            if admitted.accepted is not None:
                log.warning("%s[%d]: offsets %d-%d never became readable; skipped", topic,
                            tp.partition, admitted.accepted[0], admitted.accepted[1] - 1)
            for m in messages[:admitted.count]:
                self._next[tp] = m.offset + 1
                try:
                    env = codec.decode(m.value, heads=self._options.heads)
                except codec.DecodeError as e:
                    raise codec.DecodeError(f"{topic}[{tp.partition}]@{m.offset}: {e}") from None
                out.append(Record(topic, tp.partition, m.offset, env))
        return out

    async def batches(self) -> AsyncIterator[list[Record]]:
        """Yield non-empty batches forever (until the consumer stops)."""
        while self._consumer is not None:
            batch = await self.next_batch()
            if batch:
                yield batch

    def assignment(self) -> set[tuple[str, int]]:
        """The (logical topic, partition) pairs this consumer reads now."""
        return {(self._logical[tp.topic], tp.partition) for tp in self._assigned}


async def high_watermarks(settings: LogSettings, topics: Iterable[str] = ALL_TOPICS,
                          timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
    """The end offset of each partition of the logical ``topics``, from fetch responses.

    Reads at most a few bytes per partition: the high watermark comes with any fetch response.
    """
    consumer = AIOKafkaConsumer(**_common(settings), enable_auto_commit=False,
                                max_partition_fetch_bytes=1024, fetch_max_bytes=64 * 1024)
    probing = _probing.set(True)
    try:
        return await _high_watermarks(consumer, settings, topics, timeout_s)
    finally:
        _probing.reset(probing)


async def _high_watermarks(consumer: AIOKafkaConsumer, settings: LogSettings,
                           topics: Iterable[str], timeout_s: float
                           ) -> dict[tuple[str, int], int]:
    try:
        await start_client(consumer.start, consumer.stop)
    except KafkaError as e:
        raise _classify(e, "reading high watermarks") from e
    try:
        logical = {settings.topic(t): t for t in topics}
        tps = []
        for physical in logical:
            parts = await _partitions_for(consumer, physical)
            tps += [TopicPartition(physical, p) for p in sorted(parts)]
        if not tps:
            return {}
        consumer.assign(tps)
        for tp in tps:
            await consumer.seek_to_beginning(tp)
        result: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout_s
        while len(result) < len(tps) and time.monotonic() < deadline:
            await consumer.getmany(timeout_ms=200)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None:
                    result[(logical[tp.topic], tp.partition)] = hw
        if len(result) < len(tps):
            raise LogError("timed out reading high watermarks", retryable=True)
        return result
    except KafkaError as e:
        raise _classify(e, "reading high watermarks") from e
    finally:
        await stop_client(consumer.stop)


async def _partitions_for(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    parts = consumer.partitions_for_topic(topic)
    if parts is None:
        await consumer._client.force_metadata_update()
        parts = consumer.partitions_for_topic(topic)
    return set(parts or ())
