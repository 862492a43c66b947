"""Replaying spans of the log into a projection database through the projector's own sink.

Records go through :class:`services.projector.sink.Sink`, the code the live projector runs: the
same handlers, the same writer, the same token per partition (the partition number), and the
offsets stored with the rows. Partitions are replayed one after the other, each in offset order.
A reader task fetches and decodes the next records while the sink applies the previous ones in a
thread, so the log and the database work at the same time.

The fold is Python, so one process folds on one core however many lanes it runs.
:func:`replay_processes` runs each lane in a process of its own, with its own reader, sink and
connections: partitions are independent (each writes its own counter token, invariants 3 and
5), so lanes in separate processes project exactly what one lane does, on every core.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import pickle
import queue as queues
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Literal, NamedTuple, TextIO, TypeVar

import msgspec
import sqlalchemy as sa

from schemas import codec
from schemas.envelope import Envelope, full
from services.audit.load import CONNECT_ARGS
from services.audit.logread import PartitionReader
from services.common import eventloop
from services.common.log import Record
from services.common.settings import DatabaseSettings, LogSettings
from services.projector.sink import Applied, Sink

T = TypeVar("T")

StartMethod = Literal["fork", "spawn"]
"""How lane processes start (:mod:`multiprocessing`'s start methods of those names)."""

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
    folded: int = 0
    """Events folded a batch at a time by a bulk lane (:mod:`services.audit.bulk`), not by the
    sink; counted in ``events`` too."""
    wait_s: float = 0.0
    """The sink waiting for the reader: time the log, not the database, was the bottleneck."""
    loaded: int = 0
    """Rows a bulk lane loaded from files (:mod:`services.audit.load`), not inserted."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    def add(self, other: ReplayStats) -> None:
        """Add ``other``'s counts and busy times (not its wall time) to these."""
        for f in fields(self):
            if f.name != "wall_s":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


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


class Claims:
    """The spans of a replay, each taken by exactly one lane, biggest first (equal ones in the
    given order), by whichever lane asks first: lanes in any process iterate over the same
    claims (``next_index`` is shared memory, the index of the next span to take). Biggest first:
    a big partition taken last would keep one lane busy long after the others ended.

    A spawned lane process starts up to a second after the lane that runs in the calling
    process (importing what that one has loaded already; forked ones start at once); with spans
    spread over lanes up front, that lane then sat idle for the second at the end (measured:
    5.3 of 6.4 s busy, 2 lanes).
    """

    def __init__(self, todo: Sequence[Span], next_index: Synchronized[int]) -> None:
        self.spans = tuple(sorted(todo, key=lambda span: -span.size))
        self._next = next_index

    def __iter__(self) -> Iterator[Span]:
        while True:
            with self._next.get_lock():
                i = self._next.value
                self._next.value = i + 1
            if i >= len(self.spans):
                return
            yield self.spans[i]


async def replay(log: LogSettings, sink: Sink, todo: Sequence[Span], *,
                 batch_size: int = BATCH_SIZE, lanes: int = 1,
                 progress: Progress | None = None, bulk: bool = False) -> ReplayStats:
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
    await asyncio.gather(*(_run_lane(log, sink, spans, stats, batch_size, progress, bulk)
                           for spans in lanes_of(todo, lanes)))
    stats.wall_s = time.perf_counter() - t0
    return stats


async def _run_lane(log: LogSettings, sink: Sink, todo: Sequence[Span] | Claims,
                    stats: ReplayStats,
                    batch_size: int, progress: Progress | None, bulk: bool) -> None:
    if bulk:
        from services.audit.bulk import bulk_lane  # it builds on this module

        await bulk_lane(log, sink, todo, stats, batch_size, progress)
    else:
        await _lane(log, sink, todo, stats, batch_size, progress)


async def _lane(log: LogSettings, sink: Sink, todo: Iterable[Span], stats: ReplayStats,
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
                        pending += decode_records(span, messages)
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
            applied = await asyncio.to_thread(apply_retrying, sink, records)
            stats.apply_s += time.perf_counter() - t
            stats.statements += applied.statements
            stats.events += len(records)
            stats.transactions += 1
            if progress is not None:
                progress(span, len(records))
    finally:
        await eventloop.cancel_and_wait(reader)  # the reader's error, if it failed


class ReplayError(Exception):
    """A lane process ended without saying why (killed, or its error could not be sent)."""


@dataclass(frozen=True)
class SinkTarget:
    """What a lane process needs to build its own sink: the database and the consumer name
    stored with the applied offsets."""

    db: DatabaseSettings
    consumer: str


_POLL_S = 0.2
"""How often the parent checks that its lane processes are alive while none reports."""


async def replay_processes(log: LogSettings, target: SinkTarget, todo: Sequence[Span], *,
                           batch_size: int = BATCH_SIZE, processes: int = 2,
                           progress: Progress | None = None, bulk: bool = False,
                           start_method: StartMethod | None = None) -> ReplayStats:
    """Apply every record of ``todo``, the partitions spread over ``processes`` lanes: the first
    in this process, each other one in a process of its own. Each lane takes the next span
    when it is done with one (:class:`Claims`).

    Each lane is replayed as :func:`replay` does with one lane, into ``target`` through a sink
    of its own (in bulk, with ``bulk``). If a process fails, the others are stopped and
    its error is raised here (re-raised as the same exception when it can be sent across, else as
    :class:`ReplayError`); what the lanes committed stays committed, with its offsets, so a
    replay into the same database resumes where they stopped. ``start_method``: how lane
    processes start (default :func:`lane_start_method`).
    """
    stats = ReplayStats()
    t0 = time.perf_counter()
    if not todo:
        return stats
    n = max(1, min(processes, len(todo)))
    # The first lane runs here; the others start as forks of this process where there is
    # fork (lane_start_method).
    method = start_method or lane_start_method()
    ctx = (multiprocessing.get_context("fork") if method == "fork"
           else multiprocessing.get_context("spawn"))
    inbox: multiprocessing.queues.Queue[tuple[Any, ...]] = ctx.Queue()
    claims = Claims(todo, ctx.Value("q", 0))
    procs = {i: ctx.Process(target=_lane_process, name=f"replay-lane-{i}", daemon=True,
                            args=(i, log, target, claims, batch_size, inbox, bulk))
             for i in range(1, n)}
    _start(procs.values())
    engine = lane_engine(target)
    here = asyncio.create_task(_run_lane(log, Sink(engine, consumer=target.consumer), claims,
                                         stats, batch_size, progress, bulk))
    try:
        running = set(procs)
        while running:
            pump = asyncio.ensure_future(asyncio.to_thread(_next, inbox, procs, running))
            await asyncio.wait({pump, here}, return_when=asyncio.FIRST_COMPLETED)
            if here.done() and here.exception() is not None:
                pump.cancel()  # _next returns within _POLL_S; the processes are killed below
                await here
            match await pump:
                case ("progress", _, span, n):
                    if progress is not None:
                        progress(span, n)
                case ("done", lane, lane_stats):
                    stats.add(lane_stats)
                    running.discard(lane)
                case ("error", lane, payload):
                    raise _unpickled_error(procs[lane].name, payload)
                case message:
                    raise ReplayError(f"unexpected message from a lane process: {message!r}")
        await here
    finally:
        if not here.done():
            here.cancel()
            await asyncio.gather(here, return_exceptions=True)
        for p in procs.values():
            if p.is_alive():
                p.kill()
        for p in procs.values():
            p.join()
        inbox.close()
        engine.dispose()
    stats.wall_s = time.perf_counter() - t0
    return stats


def lane_start_method() -> StartMethod:
    """How lane processes start: forked on Linux, spawned elsewhere.

    A spawned lane spent 0.34 s of CPU (probe 9) importing what this process has loaded, and
    began that much after the lane here, which then sat idle at the end while it finished its
    last partition. Forked, in 8 alternating pairs of the replay bench: more events/s in 7
    (median +15.6%, -17% to +25%), less of the lanes' CPU in 7 (median -13%).

    Forking beside threads and a running event loop is safe here because the child uses none of
    what it inherits: a lane builds its own event loop, engine and log reader, and takes std
    streams of its own before anything else (:func:`own_std_streams`: the progress bar's
    thread may hold stderr's lock at the fork); the other threads this process may run (an
    executor's, a sampler's) hold no lock a lane takes; and the child ends in ``os._exit``
    (multiprocessing's fork), so no inherited connection or loop is closed from it.
    macOS has fork but its system libraries are not fork-safe: spawn there, as elsewhere.
    """
    return "fork" if sys.platform == "linux" else "spawn"


def _start(procs: Iterable[BaseProcess]) -> None:
    """Start ``procs``: forks share this process's heap copy-on-write, so its objects are
    frozen first (``gc.freeze``) that a child's collections do not write to, and copy, every
    page of them. Python 3.12 and later warn of any fork beside threads (see
    :func:`lane_start_method` for why a lane's is safe)."""
    # A process that froze its heap for good (services.common.gcpause) keeps it so.
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"This process .* is multi-threaded",
                                    DeprecationWarning)
            for p in procs:
                p.start()
    finally:
        if ours:
            gc.unfreeze()


def own_std_streams() -> None:
    """Give this process, forked, ``sys.stdout`` and ``sys.stderr`` of its own.

    A fork copies the parent's streams with their buffers' locks, which another thread of the
    parent may hold at that instant (the rebuild's progress bar draws on stderr ten times a
    second): the child's first flush would then wait forever, as a forked child's flush of
    stderr did while a thread of its parent wrote to a full pipe. Each stream with a file
    descriptor is replaced by a new one on it, and logging's stream handlers that wrote to
    the old one write to the new. What an old one held unwritten is the parent's to write.
    """
    replaced: dict[int, TextIO] = {}
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        try:
            fd = old.fileno()
        except (AttributeError, OSError, ValueError):  # no stream, or not on a descriptor
            continue
        lines = bool(getattr(old, "line_buffering", True))
        new = open(fd, "w", buffering=1 if lines else -1, closefd=False,  # noqa: SIM115
                   encoding=str(getattr(old, "encoding", None) or "utf-8"),
                   errors=str(getattr(old, "errors", None) or "strict"))
        setattr(sys, name, new)
        replaced[id(old)] = new
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict
                                      .values() if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in replaced:
                handler.stream = replaced[id(handler.stream)]


def lane_engine(target: SinkTarget) -> sa.Engine:
    """The engine of one lane.

    READ COMMITTED: lanes insert rows of different batches side by side, and REPEATABLE READ's
    gap locks made such inserts deadlock (seen in CI). A lane's partitions have no other
    writer, and every transaction still reads its own writes. Its connections may load
    files (:mod:`services.audit.load`).
    """
    return sa.create_engine(target.db.url(), pool_size=2, max_overflow=1,
                            isolation_level="READ COMMITTED", connect_args=CONNECT_ARGS)


def _next(inbox: multiprocessing.queues.Queue[tuple[Any, ...]], procs: Mapping[int, BaseProcess],
          running: set[int]) -> tuple[Any, ...]:
    """The next message; raises when a running lane process exited without its last word."""
    while True:
        try:
            return inbox.get(timeout=_POLL_S)
        except queues.Empty:
            pass
        exited = [i for i in sorted(running) if procs[i].exitcode is not None]
        if not exited:
            continue
        try:  # a process flushes what it put before it exits: read what is left first
            return inbox.get(timeout=1.0)
        except queues.Empty:
            p = procs[exited[0]]
            raise ReplayError(f"{p.name} exited with code {p.exitcode} before it finished "
                              "its partitions") from None


def _unpickled_error(name: str, payload: bytes | str) -> BaseException:
    if isinstance(payload, str):
        return ReplayError(f"{name} failed: {payload}")
    try:
        error = pickle.loads(payload)
    except Exception:  # a class the parent cannot rebuild: say what it was
        return ReplayError(f"{name} failed (its error could not be unpickled)")
    if isinstance(error, BaseException):
        return error
    return ReplayError(f"{name} failed: {error!r}")


def _lane_process(lane: int, log: LogSettings, target: SinkTarget, todo: Claims,
                  batch_size: int, outbox: multiprocessing.queues.Queue[tuple[Any, ...]],
                  bulk: bool = False) -> None:
    """A lane process: replay ``todo`` into ``target``, reporting progress, then its stats or
    its error, on ``outbox``."""
    own_std_streams()
    engine = lane_engine(target)
    try:
        stats = ReplayStats()
        sink = Sink(engine, consumer=target.consumer)
        eventloop.run(_run_lane(log, sink, todo, stats, batch_size,
                                lambda span, n: outbox.put(("progress", lane, span, n)), bulk),
                      eventloop.loop_factory())
        outbox.put(("done", lane, stats))
    except BaseException as e:  # the process's top level: the parent raises it
        # Where it failed stays here: what crosses to the parent is the exception alone.
        traceback.print_exc(file=sys.stderr)
        payload: bytes | str = f"{type(e).__name__}: {e}"
        try:
            pickled = pickle.dumps(e)
            pickle.loads(pickled)
            payload = pickled
        except Exception:  # not picklable both ways: its text goes instead
            pass
        outbox.put(("error", lane, payload))
    finally:
        engine.dispose()


_DEADLOCK, _LOCK_WAIT_TIMEOUT = 1213, 1205


def apply_retrying(sink: Sink, records: list[Record], attempts: int = 12) -> Applied:
    """Apply, retrying a transaction the server rolled back for a deadlock between lanes.

    Retrying is safe: the offsets are stored with the rows, so nothing is applied twice.
    """
    return retry_deadlocks(lambda: sink.apply(records), attempts)


def retry_deadlocks(transaction: Callable[[], T], attempts: int = 12) -> T:
    """Run ``transaction``, again after a deadlock or lock wait timeout rolled it back.

    The waits are random and growing: two lanes that deadlocked would otherwise retry in step
    and meet again.
    """
    for attempt in range(attempts):
        try:
            return transaction()
        except sa.exc.OperationalError as e:
            code = e.orig.args[0] if e.orig is not None and e.orig.args else None
            if code not in (_DEADLOCK, _LOCK_WAIT_TIMEOUT) or attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.02, 0.1) * 2 ** min(attempt, 5))
    raise AssertionError("unreachable")


def decode_envelopes(span: Span, messages: Sequence[Any], *, bulk: bool = False
                     ) -> list[Envelope]:
    """The envelopes of ``messages`` (aiokafka's, of ``span``'s partition), decoded as the
    projector reads them; the first that is not an envelope raises :class:`DecodeError`
    naming its position.

    In one loop of typed decodes (:func:`schemas.codec.decode_many`). With ``bulk``, as a
    bulk lane folds them: SJ, MJS and MJC with their resources undecoded
    (:func:`full_records` makes them events again).
    """
    try:
        return codec.decode_many([m.value for m in messages], heads=True, bulk=bulk)
    except codec.DecodeError:
        return [decode_record(span, m.offset, m.value) for m in messages]  # names the bad one


def decode_records(span: Span, messages: Sequence[Any]) -> list[Record]:
    """The records of ``messages``: :func:`decode_envelopes` with their positions.

    Each record is made as a plain tuple of its class: per record, a call of
    :func:`decode_record` and the ``NamedTuple``'s ``__new__`` cost 0.8 us against 1.9 for the
    rest of its decode.
    """
    envs = decode_envelopes(span, messages)
    new, topic, partition = tuple.__new__, span.topic, span.partition
    return [new(Record, (topic, partition, m.offset, env))
            for m, env in zip(messages, envs, strict=True)]


def full_records(span: Span, records: Sequence[Record]) -> list[Record]:
    """``records`` of a bulk decode (:func:`decode_records`) as the projector reads them:
    :class:`DecodeError` naming the position of the first with resources that are not a
    resource list (the check their decode left out)."""
    out: list[Record] = []
    for r in records:
        try:
            env = full(r.envelope)
        except msgspec.DecodeError as e:
            raise codec.DecodeError(f"{span.label}@{r.offset}: invalid resources: {e}") from None
        out.append(r if env is r.envelope else r._replace(envelope=env))
    return out


def decode_record(span: Span, offset: int, value: bytes) -> Envelope:
    try:
        return codec.decode(value, heads=True)  # the projection reads no spec
    except codec.DecodeError as e:
        raise codec.DecodeError(f"{span.label}@{offset}: {e}") from None
