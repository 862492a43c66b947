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

import contextlib
import time
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa

from core.billing import JobUsage
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
    """
    every = todo.spans if isinstance(todo, Claims) else todo
    stored = sink.store.load(sink.consumer, sorted({s.topic for s in every}))
    async with PartitionReader(log, max_records=batch_size) as reader:
        for span in todo:
            bulk = span.size <= MAX_RECORDS and not stored.get((span.topic, span.partition))
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
                    _fold_span(sink, span, envs, offsets, stats, batch_size, progress)
                # Freed while paused: the first collection after the pause would otherwise
                # scan every envelope still held (8% of the lane, measured).
                envs, offsets = [], []


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


def _fold_span(sink: Sink, span: Span, envs: list[Envelope], offsets: list[int],
               stats: ReplayStats, batch_size: int, progress: Progress | None) -> None:
    """Fold what can be folded, send the rest through the sink, then store the position.

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
            _write(engine, chunk, stats)
            chunk, rows = [], 0
    if chunk:
        _write(engine, chunk, stats)
    stats.apply_s += time.perf_counter() - t
    stats.events += folded
    stats.folded += folded
    if progress is not None and folded:
        progress(span, folded)
    rest: list[Record] = []
    if others or unfolded:  # in log order
        new, topic, partition = tuple.__new__, span.topic, span.partition
        rest = [new(Record, (topic, partition, offset, env))
                for offset, env in zip(offsets, envs, strict=True)
                if not isinstance(env.event, BatchEvent) or env.event.batch_id in unfolded]
    _through_sink(sink, span, full_records(span, rest), stats, batch_size, progress)
    with engine.begin() as conn:
        sink.store.set_position(conn, sink.consumer, span.topic, span.partition, span.end)


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
    writer.emit(_with_usage_texts(rest))
    writer.flush()
    return writer.statements + len(loads), loaded


def _with_usage_texts(ops: list[Op]) -> list[Op]:
    """``ops`` with each job's usage (:class:`core.billing.JobUsage`, the bulk fold's) made
    its text: the writer writes values as they are."""
    out: list[Op] = []
    for op in ops:
        if type(op) is InsertIgnore:
            usages = {c for row in op.rows for c, v in row.items() if type(v) is JobUsage}
            if usages:
                op = InsertIgnore(op.table, [
                    {c: v.text() if type(v) is JobUsage else v for c, v in row.items()}
                    for row in op.rows])
        out.append(op)
    return out


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
