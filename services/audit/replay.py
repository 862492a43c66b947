"""Replaying spans of the log into a projection database through the projector's own sink.

Records go through :class:`services.projector.sink.Sink`, the code the live projector runs: the
same handlers, the same writer, the same token per partition (the partition number), and the
offsets stored with the rows. Partitions are replayed one after the other, each in offset order.
A reader task fetches and decodes the next records while the sink applies the previous ones in a
thread, so the log and the database work at the same time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import sqlalchemy as sa

from schemas import codec
from schemas.envelope import Envelope
from services.audit.logread import PartitionReader
from services.common.log import Record
from services.common.settings import LogSettings
from services.projector.sink import Applied, Sink

BATCH_SIZE = 5_000
"""Records per sink transaction (the live projector takes up to 2,000 at a time)."""
QUEUE_DEPTH = 4


class Span(NamedTuple):
    """Offsets ``[start, end)`` of one partition of a logical topic."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    @property
    def label(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass
class ReplayStats:
    """What a replay did and where its time went (seconds)."""

    events: int = 0
    transactions: int = 0
    statements: int = 0
    """Write statements the sink's writer issued (its reads are not counted)."""
    wall_s: float = 0.0
    apply_s: float = 0.0
    """In the sink: handlers, SQL and commits."""
    decode_s: float = 0.0
    """Decoding envelopes (in the reader, overlapping the sink)."""
    wait_s: float = 0.0
    """The sink waiting for the reader: time the log, not the database, was the bottleneck."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0


def spans(start: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int],
          topics: Sequence[str]) -> list[Span]:
    """The non-empty spans from ``start`` (default 0) to ``end``, topic by topic, in partition
    order within a topic."""
    out = []
    for topic in topics:
        for (t, p), stop in sorted(end.items()):
            begin = start.get((t, p), 0)
            if t == topic and stop > begin:
                out.append(Span(t, p, begin, stop))
    return out


def behind(end: Mapping[tuple[str, int], int], applied: Mapping[tuple[str, int], int]
           ) -> dict[tuple[str, int], int]:
    """How many offsets each partition's applied position is short of ``end`` (lagging only)."""
    return {tp: stop - applied.get(tp, 0) for tp, stop in end.items()
            if applied.get(tp, 0) < stop}


Progress = Callable[[Span, int], None]
"""Called with the span and the number of records just applied."""


def lanes_of(todo: Sequence[Span], n: int) -> list[list[Span]]:
    """Spread spans over ``n`` lanes, biggest first onto the least loaded; each lane keeps the
    spans in their given order. A partition is in exactly one lane."""
    load = [0] * max(1, n)
    chosen: dict[int, int] = {}
    for i in sorted(range(len(todo)), key=lambda i: -todo[i].size):
        lane = min(range(len(load)), key=lambda k: (load[k], k))
        chosen[i] = lane
        load[lane] += todo[i].size
    out: list[list[Span]] = [[] for _ in load]
    for i, span in enumerate(todo):
        out[chosen[i]].append(span)
    return [lane for lane in out if lane]


async def replay(log: LogSettings, sink: Sink, todo: Sequence[Span], *,
                 batch_size: int = BATCH_SIZE, lanes: int = 1,
                 progress: Progress | None = None) -> ReplayStats:
    """Apply every record of ``todo`` through ``sink``, span after span.

    With ``lanes`` > 1, that many partitions are replayed at the same time, each in its own
    transactions (as several projector instances would); a partition is only ever in one lane,
    so its records stay in order. ``apply_s`` and ``wait_s`` then add up over lanes.

    Raises:
        services.common.log.LogError: a partition stopped short of its span's end.
        schemas.codec.DecodeError: a record is not a valid envelope (its position is named).
    """
    stats = ReplayStats()
    t0 = time.perf_counter()
    await asyncio.gather(*(_lane(log, sink, spans, stats, batch_size, progress)
                           for spans in lanes_of(todo, lanes)))
    stats.wall_s = time.perf_counter() - t0
    return stats


async def _lane(log: LogSettings, sink: Sink, todo: Sequence[Span], stats: ReplayStats,
                batch_size: int, progress: Progress | None) -> None:
    queue: asyncio.Queue[tuple[Span, list[Record]] | None] = asyncio.Queue(QUEUE_DEPTH)

    async def read() -> None:
        try:
            async with PartitionReader(log, max_records=batch_size) as reader:
                for span in todo:
                    pending: list[Record] = []
                    async for messages in reader.read(span.topic, span.partition, span.start,
                                                      span.end):
                        t = time.perf_counter()
                        pending += [Record(span.topic, span.partition, m.offset,
                                           _decode(span, m.offset, m.value)) for m in messages]
                        stats.decode_s += time.perf_counter() - t
                        if len(pending) >= batch_size:
                            await queue.put((span, pending))
                            pending = []
                    if pending:
                        await queue.put((span, pending))
        except asyncio.CancelledError:
            raise  # the sink failed: nobody reads the queue any more
        except BaseException:
            await queue.put(None)
            raise
        await queue.put(None)

    reader = asyncio.create_task(read())
    try:
        while True:
            t = time.perf_counter()
            item = await queue.get()
            stats.wait_s += time.perf_counter() - t
            if item is None:
                break
            span, records = item
            t = time.perf_counter()
            applied = await asyncio.to_thread(_apply, sink, records)
            stats.apply_s += time.perf_counter() - t
            stats.statements += applied.statements
            stats.events += len(records)
            stats.transactions += 1
            if progress is not None:
                progress(span, len(records))
    finally:
        if not reader.done():
            reader.cancel()
        try:
            await reader  # the reader's error, if it failed
        except asyncio.CancelledError:
            if not reader.cancelled():
                raise


_DEADLOCK, _LOCK_WAIT_TIMEOUT = 1213, 1205


def _apply(sink: Sink, records: list[Record], attempts: int = 5) -> Applied:
    """Apply, retrying a transaction the server rolled back for a deadlock between lanes.

    Retrying is safe: the offsets are stored with the rows, so nothing is applied twice.
    """
    for attempt in range(attempts):
        try:
            return sink.apply(records)
        except sa.exc.OperationalError as e:
            code = e.orig.args[0] if e.orig is not None and e.orig.args else None
            if code not in (_DEADLOCK, _LOCK_WAIT_TIMEOUT) or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _decode(span: Span, offset: int, value: bytes) -> Envelope:
    try:
        return codec.decode(value)
    except codec.DecodeError as e:
        raise codec.DecodeError(f"{span.label}@{offset}: {e}") from None
