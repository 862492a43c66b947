"""The rebuild's bulk lane: whole partitions read first, common batches folded in memory.

A replay through the sink (:mod:`services.audit.replay`) folds event by event, reading back
what it wrote. Into a fresh database, a lane can instead read a whole partition, fold each
batch whose history is the common lifecycle at once (:func:`core.projection.bulk.fold_batch`:
every row written once, in its final state) and send everything else, in log order, through
the projector's sink: other batches, and the partition's events that belong to no batch.

Batches are independent, and writes that two batches share (fair-share, billing and rate
counters) are increments, which commute; so the two halves may be written in either order and
give what the sink alone gives. The audit's diff checks exactly that.

A bulk lane is not resumable: its batches' rows and the partition's position are written in
separate transactions. It only takes partitions the consumer has applied nothing of (a rebuild
into a new database; a failed rebuild drops it), and partitions larger than
:data:`MAX_RECORDS`, which would not fit in memory, go through the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import sqlalchemy as sa

from core.projection.bulk import ResourceLists, Timed, fold_batch
from core.projection.ops import InsertIgnore, Op, Row
from schemas.base import BatchEvent
from schemas.envelope import Envelope
from services.audit.load import NotLoadable, can_load, load
from services.audit.logread import PartitionReader
from services.audit.replay import (
    Claims,
    Progress,
    ReplayStats,
    Span,
    apply_retrying,
    decode_envelopes,
    decode_records,
    full_records,
    retry_deadlocks,
)
from services.common import gcpause
from services.common.gcpause import gc_paused
from services.common.log import Record
from services.common.settings import LogSettings
from services.projector.sink import Sink
from services.projector.writer import Writer

MAX_RECORDS = 2_000_000
"""The largest partition a bulk lane holds in memory (about 1 KiB per decoded event)."""
WRITE_ROWS = 100_000
"""Rows (about) per transaction of folded batches. Loading 337,000 rows of the replay bench
in transactions of 100,000 cost 0.021 ms of CPU per event (MariaDB and Python), against 0.025
in transactions of 20,000; inserting them cost 0.028 either way."""


async def bulk_lane(log: LogSettings, sink: Sink, todo: Sequence[Span] | Claims,
                    stats: ReplayStats, batch_size: int, progress: Progress | None) -> None:
    """Replay ``todo`` into the sink's database: folded batches in bulk, the rest by ``sink``.

    Spans the consumer applied anything of, and spans too large to hold, go through ``sink``
    record by record as :func:`services.audit.replay.replay` would.

    The folded rows are written by a thread of the lane (:class:`_Writes`) while the lane reads
    and folds what comes next: a write is mostly waiting for the database (its loads, its
    commit's flush), and two lanes waiting at once left the machine idle.
    """
    every = todo.spans if isinstance(todo, Claims) else todo
    stored = sink.store.load(sink.consumer, sorted({s.topic for s in every}))
    writes = _Writes(stats, progress)
    try:
        async with PartitionReader(log, max_records=batch_size) as reader:
            for span in todo:
                bulk = span.size <= MAX_RECORDS and not stored.get((span.topic, span.partition))
                if not bulk:
                    await writes.drain()  # the sink is used from this thread from here on
                # A folded span's records all live until it is written: nothing for the cyclic
                # collector to find, and a fifth of the lane's CPU spent looking (gcpause.py).
                with gc_paused() if bulk else contextlib.nullcontext():
                    envs: list[Envelope] = []
                    offsets: list[int] = []
                    async for messages in reader.read(span.topic, span.partition, span.start,
                                                      span.end):
                        t = time.perf_counter()
                        if bulk:
                            envs += decode_envelopes(span, messages, bulk=True)
                            offsets += [m.offset for m in messages]
                            stats.decode_s += time.perf_counter() - t
                        else:
                            records = decode_records(span, messages)
                            stats.decode_s += time.perf_counter() - t
                            _through_sink(sink, span, records, stats, batch_size, progress)
                    if bulk:
                        await _fold_span(sink, span, envs, offsets, stats, batch_size, writes)
                    # Freed while paused: the first collection after the pause would otherwise
                    # scan every envelope still held (8% of the lane, measured).
                    envs, offsets = [], []
            await writes.drain()
    finally:
        writes.close()


class _Writes:
    """A bulk lane's writes, run one after another in a thread of their own, in the order
    given. At most one is running or waiting: the lane's next write waits for the one before
    it, so a lane holds at most two writes' rows.

    A write returns its own :class:`ReplayStats`, added to the lane's when the lane next waits
    for it; its progress is reported on the lane's event loop.
    """

    def __init__(self, stats: ReplayStats, progress: Progress | None) -> None:
        self._stats = stats
        self._progress = progress
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="bulk-write")
        self._pending: Future[ReplayStats] | None = None
        self._loop = asyncio.get_running_loop()

    def progress(self, span: Span, n: int) -> None:
        """Report progress from the writing thread (on the lane's loop)."""
        if self._progress is not None:
            self._loop.call_soon_threadsafe(self._progress, span, n)

    async def submit(self, write: Callable[[], ReplayStats]) -> None:
        """Run ``write`` once the write before it has ended (its error is raised here).

        The collector stays paused from here until ``write`` has ended: what it writes was
        made in the lane's pause, and ``write`` lets it go before the pause ends (gcpause.py).
        """
        await self.drain()
        gcpause.pause()
        try:
            self._pending = self._pool.submit(_resuming, write)
        except BaseException:
            gcpause.resume()
            raise

    async def drain(self) -> None:
        """Wait for the write in flight; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._stats.add(await asyncio.wrap_future(pending))

    def close(self) -> None:
        """Wait for the write in flight, blocking (a lane that stops for an error or a
        cancellation must not leave a write running on its engine), and end the thread.

        A write submitted and not yet started still runs: cancelled, it would leave the
        collector paused (:meth:`submit`)."""
        self._pool.shutdown(wait=True)


def _through_sink(sink: Sink, span: Span, records: list[Record], stats: ReplayStats,
                  batch_size: int, progress: Progress | None) -> None:
    for i in range(0, len(records), batch_size):
        chunk = records[i:i + batch_size]
        t = time.perf_counter()
        applied = apply_retrying(sink, chunk)
        stats.apply_s += time.perf_counter() - t
        stats.statements += applied.statements
        stats.events += len(chunk)
        stats.transactions += 1
        if progress is not None:
            progress(span, len(chunk))


async def _fold_span(sink: Sink, span: Span, envs: list[Envelope], offsets: list[int],
                     stats: ReplayStats, batch_size: int, writes: _Writes) -> None:
    """Fold what can be folded and hand its rows to ``writes``; then the rest, through the
    sink, and the span's position, also by ``writes`` (after the rows, in that thread).

    ``envs`` are the span's envelopes in log order (a bulk decode), ``offsets`` their
    positions. Batches are folded from their (event, time) pairs: only what goes to the sink
    is made a record (a record per envelope, then a history per batch, cost 0.9 us an event
    against 0.3 for the pairs alone, measured).
    """
    engine = sink.engine
    t = time.perf_counter()
    by_batch: dict[int, list[Timed]] = defaultdict(list)
    others = 0
    for env in envs:
        event = env.event
        if isinstance(event, BatchEvent):
            by_batch[event.batch_id].append((event, env.time_ms))
        else:
            others += 1
    chunk: list[Op] = []
    rows = folded = 0
    resource_lists: ResourceLists = {}  # each distinct one decoded once per partition
    unfolded: set[int] = set()
    for batch_id, history in by_batch.items():
        ops = fold_batch(history, token=span.partition, resource_lists=resource_lists)
        if ops is None:
            unfolded.add(batch_id)
            continue
        chunk += ops
        folded += len(history)
        rows += sum(len(getattr(op, "rows", ())) or 1 for op in ops)
        if rows >= WRITE_ROWS:
            stats.apply_s += time.perf_counter() - t
            await writes.submit(partial(_write_folded, engine, chunk))
            t = time.perf_counter()
            chunk, rows = [], 0
    del by_batch
    rest: list[Record] = []
    if others or unfolded:  # in log order
        new, topic, partition = tuple.__new__, span.topic, span.partition
        rest = full_records(span, [
            new(Record, (topic, partition, offset, env))
            for offset, env in zip(offsets, envs, strict=True)
            if not isinstance(env.event, BatchEvent) or env.event.batch_id in unfolded])
    stats.apply_s += time.perf_counter() - t
    await writes.submit(partial(_finish_span, sink, span, chunk, folded, rest, batch_size,
                                 writes))


def _resuming(write: Callable[[], ReplayStats]) -> ReplayStats:
    try:
        return write()
    finally:
        gcpause.resume()


def _write_folded(engine: sa.Engine, ops: list[Op]) -> ReplayStats:
    """(In the writing thread) write ``ops`` in one transaction, and let them go."""
    stats = ReplayStats()
    t = time.perf_counter()
    try:
        _write(engine, ops, stats)
    finally:
        ops.clear()  # inside the pause (_Writes.submit)
    stats.apply_s += time.perf_counter() - t
    return stats


def _finish_span(sink: Sink, span: Span, ops: list[Op], folded: int, rest: list[Record],
                 batch_size: int, writes: _Writes) -> ReplayStats:
    """(In the writing thread) a folded span's last rows, its other records through the sink in
    log order, then its position."""
    stats = _write_folded(sink.engine, ops) if ops else ReplayStats()
    stats.events += folded
    stats.folded += folded
    if folded:
        writes.progress(span, folded)
    _through_sink(sink, span, rest, stats, batch_size, writes.progress)
    rest.clear()
    with sink.engine.begin() as conn:
        sink.store.set_position(conn, sink.consumer, span.topic, span.partition, span.end)
    return stats


def _write(engine: sa.Engine, ops: list[Op], stats: ReplayStats) -> None:
    """Write ``ops`` in one transaction, retried whole if the server rolls it back for a
    deadlock with another lane."""

    def once() -> tuple[int, int]:
        with engine.begin() as conn:
            return write_ops(conn, ops)

    statements, loaded = retry_deadlocks(once)
    stats.statements += statements
    stats.loaded += loaded
    stats.transactions += 1


def write_ops(conn: sa.Connection, ops: Sequence[Op]) -> tuple[int, int]:
    """Write ``ops`` on ``conn`` (in the caller's transaction) as a bulk lane does: new rows
    of tables keyed by the batch loaded from files when the connection can
    (:mod:`services.audit.load`), the rest by the projector's writer. Returns the statements
    and the rows loaded."""
    rest, loads = split_loads(ops) if can_load(conn) else (list(ops), {})
    loaded = 0
    for table, rows in loads.items():
        try:
            load(conn, table, rows)
            loaded += len(rows)
        except NotLoadable:
            rest.append(InsertIgnore(table, rows))
    writer = Writer(conn)
    writer.emit(rest)
    writer.flush()
    return writer.statements + len(loads), loaded


def split_loads(ops: Sequence[Op]) -> tuple[list[Op], dict[str, list[Row]]]:
    """``ops`` split into the rows to load (new rows of tables keyed by the batch, by table)
    and what the writer writes, in order. Loads go first: nothing else a fold emits comes
    before the rows it inserts."""
    rest: list[Op] = []
    loads: dict[str, list[Row]] = {}
    shapes: dict[str, tuple[str, ...]] = {}
    for op in ops:
        if type(op) is InsertIgnore and op.rows and "batch_id" in op.rows[0]:
            shape = tuple(op.rows[0])
            if shapes.setdefault(op.table, shape) == shape:
                loads.setdefault(op.table, []).extend(op.rows)
                continue
        rest.append(op)
    return rest, loads
