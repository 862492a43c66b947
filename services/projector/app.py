"""The projector as a faust-streaming app: a thin agent that hands event batches to the sink.

One agent, over every projected topic, takes events in batches (``take_events``: one event at
a time is ten times slower) and applies them with :class:`~services.projector.sink.Sink` in
one MySQL transaction that also stores the offsets. Faust still commits offsets to Kafka, but
the database is the truth: on every assignment the consumer seeks each partition to the offset
stored with the projection, so a crash between the MySQL commit and Kafka's never re-applies or
loses a record. A record that cannot be applied (not an event, or an error other than the
database being unreachable) stops the process with a non-zero exit after what precedes it in
its batch is applied: it is never skipped. The process exits within :data:`STOP_GRACE_S` of
it even when faust's orderly shutdown hangs on the broker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import faust
import sqlalchemy as sa
from faust.types import TP
from mode import CrashingSupervisor

from schemas import codec
from schemas import topics as logical_topics
from schemas.execution import (
    AttemptHeartbeat,
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
)
from services.common.log import Record
from services.common.metrics import MetricsServer
from services.common.settings import PROJECTOR_CONSUMER, Settings
from services.projector import metrics
from services.projector.sink import Applied, Sink, Stale
from services.projector.stream import QuietStream
from services.projector.transport import use_transport

log = logging.getLogger(__name__)

PROJECTED_TOPICS = (logical_topics.CONTROL, logical_topics.BATCH, logical_topics.SCHEDULER)
BATCH_SIZE = 2_000
BATCH_WITHIN_S = 0.01  # a batch waits at most this long to fill: latency on the serial path
BATCH_WITHIN_ENV = "HS_PROJECTOR_BATCH_WITHIN_MS"
"""Overrides :data:`BATCH_WITHIN_S`. Longer waits make fewer, larger transactions: at 50 ms the
projector spent 11% less CPU per no-op job and MariaDB 25% less, and the execution bench ran
536-654 jobs/s against 449-516 at 10 ms (interleaved runs). But every write a client waits on
(read-your-writes) may wait that much longer."""


EXECUTION_LINGER_S = 0.04
EXECUTION_LINGER_ENV = "HS_PROJECTOR_EXECUTION_LINGER_MS"
"""Overrides :data:`EXECUTION_LINGER_S`: how long a batch of execution reports alone (see
:func:`lingers`) waits before it is applied, so that the next batch gathers what arrives
meanwhile. Nobody waits to read those applied, so the wait costs no client anything, and the
projector's fixed cost per transaction (offsets, state reads, a statement per table, the
commit) is paid for more jobs at once: in a 30k no-op run, 40 ms took the projector from
0.35-0.37 to 0.28 ms of CPU per job, MariaDB from 0.20-0.22 to 0.17 and the broker from 0.13 to
0.11 (fewer fetches), and the run from 903-912 to 992 jobs/s. A batch with anything else in it (a
submission, a commit, a cancel: writes whose clients wait for them, read-your-writes) is
applied at once, so those waits stay as short as :data:`BATCH_WITHIN_S` makes them."""

MAX_TRANSACTION_BYTES = 16 * 1024 * 1024
"""Bytes of records (as the log holds them, uncompressed) one transaction applies at most: a
batch of events past it is applied in several transactions, in order. A projector that fell
behind a big submission took up to 277 job bunches (283k jobs) in one transaction: 880 MB of
memory and nearly 5 s before the applied offsets moved, which paced ingest's answers in jumps.
16 MiB is about 40 bunches of the official client's 1,024 no-op jobs; execution events are a
few hundred bytes, so their batches (at most :data:`BATCH_SIZE` events) are never split."""

STREAM_BUFFER = 128
STREAM_BUFFER_ENV = "HS_PROJECTOR_STREAM_BUFFER"
"""Records read from the log ahead of the agent, at most, per partition (faust's
``stream_buffer_maxsize``, 4,096 by default; fetching a partition pauses once its buffer is
about 80% full and resumes at 40%). A projector that falls behind a big submission holds
that many job bunches decompressed, some 390 KB each for the official client's 1,024 no-op
jobs: at faust's default it grew from 89 to 409 MB through the 1M submit, each new page a
fault (110,000-126,000 a run, a few microseconds each on this VM at a fast hour, 13-23 at a
slow one). At 128 (50 MB of bunches) execution batches still fill as before: the agent
takes a few hundred reports a transaction at 1,900 jobs/s. Measured pairs are in
docs/performance.md. ``HS_PROJECTOR_STREAM_BUFFER`` overrides it."""

SETTLE_BEHIND_S = 0.5
"""How long a transaction committing behind may go unawaited with no batch after it before
the projector waits for its commit on its own (:func:`create_app`)."""

STOP_GRACE_S = 20.0
"""How long a projector that hit a record it cannot apply waits for faust's orderly shutdown
before it exits anyway. The shutdown talks to the broker (a final commit, leaving the group)
and can wait out a request timeout of 90 s or more; meanwhile the process looks alive to its
supervisor and to anyone waiting for it to stop (seen once in CI: a projector that had logged
the record and stopped applying was still running 60 s later). Exiting without the rest loses
nothing: the database holds the applied offsets, and a restart stops at the same record."""


def exit_unless_stopped(seconds: float, code: int = 1,
                        exit: Callable[[int], object] = os._exit) -> threading.Timer:
    """Arm a timer that ends the process with ``code`` in ``seconds`` unless it has exited
    by then (a daemon thread: it never holds the process up). ``exit`` is for tests."""
    def fire() -> None:
        log.critical("projector still running %.0f s after it stopped applying; exiting now",
                     seconds)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        exit(code)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


UNAWAITED: tuple[type, ...] = (JobScheduled, JobsScheduled, JobStarted, JobCompleted,
                               JobsCompleted, AttemptHeartbeat)
"""Events no client waits to see applied: the scheduler's and the workers' reports."""


BEHIND_S = 1.0
"""How old the newest record of a batch is when the projector counts as behind the log
(:func:`lagging`). Records reach it up to 0.2 s old when it keeps up on the one-machine stack
(a worker's outbox, the broker's fetch wait)."""


def lagging(records: Sequence[Record], now_ms: int) -> bool:
    """Whether the newest of ``records`` was made :data:`BEHIND_S` or more before ``now_ms``:
    the projector is behind the log, and the sink commits a big transaction behind instead of
    before it takes the next batch. A projector that keeps up does not: it took its next
    batch sooner and smaller, and MariaDB spent 12% more CPU a job (docs/performance.md)."""
    return bool(records) and now_ms - max(r.envelope.time_ms for r in records) >= (
        BEHIND_S * 1000)


def lingers(records: Sequence[Record]) -> bool:
    """Whether a batch may wait before it is applied: a batch short of :data:`BATCH_SIZE` made
    only of :data:`UNAWAITED` events. Also when the projector is behind the log: skipping the
    wait then (the batch's newest record a second old) took a projector held to one core to
    smaller batches and 7.8% more CPU a job, though behind a log of single SJs, MJSs and MJCs
    it applied 4,759 records a second without the wait against 2,900 with it."""
    return 0 < len(records) < BATCH_SIZE and all(
        isinstance(r.envelope.event, UNAWAITED) for r in records)


def _milliseconds(env: Mapping[str, str], name: str, default_s: float) -> float:
    """Seconds from the whole milliseconds ``env[name]`` (default ``default_s``); ValueError,
    saying why, for a value that is not 0-5000 ms."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default_s
    try:
        ms = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be whole milliseconds, not {raw!r}") from None
    if not 0 <= ms <= 5_000:
        raise ValueError(f"{name} must be between 0 and 5000 ms, not {ms}")
    return ms / 1000


def batch_within_s(env: Mapping[str, str]) -> float:
    """The batch wait :data:`BATCH_WITHIN_ENV` asks for, in seconds (default
    :data:`BATCH_WITHIN_S`); ValueError, saying why, for a value that is not 0-5000 ms."""
    return _milliseconds(env, BATCH_WITHIN_ENV, BATCH_WITHIN_S)


def execution_linger_s(env: Mapping[str, str]) -> float:
    """The linger :data:`EXECUTION_LINGER_ENV` asks for, in seconds (default
    :data:`EXECUTION_LINGER_S`); ValueError, saying why, for a value that is not 0-5000 ms."""
    return _milliseconds(env, EXECUTION_LINGER_ENV, EXECUTION_LINGER_S)


def stream_buffer(env: Mapping[str, str]) -> int:
    """The read-ahead :data:`STREAM_BUFFER_ENV` asks for (default :data:`STREAM_BUFFER`);
    ValueError, saying why, for a value that is not a whole number from 8 to 65,536."""
    raw = env.get(STREAM_BUFFER_ENV)
    if raw is None or raw == "":
        return STREAM_BUFFER
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{STREAM_BUFFER_ENV} must be a whole number of records, "
                         f"not {raw!r}") from None
    if not 8 <= n <= 65_536:
        raise ValueError(f"{STREAM_BUFFER_ENV} must be between 8 and 65536 records, not {n}")
    return n


def transactions(events: Sequence[Any], max_bytes: int = MAX_TRANSACTION_BYTES
                 ) -> Iterator[Sequence[Any]]:
    """``events`` (faust events of raw records) in order, cut into runs of at most
    ``max_bytes`` of record values; a record bigger than that is a run of its own."""
    start, size = 0, 0
    for i, ev in enumerate(events):
        n = len(ev.message.value or b"")
        if i > start and size + n > max_bytes:
            yield events[start:i]
            start, size = i, 0
        size += n
    if start < len(events):
        yield events[start:]


def _records(events: Iterable[Any], logical: dict[str, str]
             ) -> tuple[list[Record], codec.DecodeError | None]:
    """The records of a batch of events, up to the first that is not an envelope, and the
    error naming that one's position (None if every event decoded)."""
    out: list[Record] = []
    for ev in events:
        m = ev.message
        try:
            env = codec.decode(m.value, heads=True)  # the projection reads no spec
        except codec.DecodeError as e:
            return out, codec.DecodeError(f"{m.topic}[{m.partition}]@{m.offset}: {e}")
        out.append(Record(logical[m.topic], m.partition, m.offset, env))
    return out, None


async def apply_with_retry(sink: Sink, records: list[Record], *, first_delay_s: float = 0.2,
                           max_delay_s: float = 10.0, lagging: bool = True) -> Applied:
    """Apply records, retrying while the database is unreachable.

    Retrying is safe: the sink skips what a failed attempt may have committed (offsets are
    stored with the rows). Other errors (a bug, a constraint violation) are not retried: they
    stop the projector process (see the module docstring) rather than skip a record.
    """
    delay = first_delay_s
    while True:
        try:
            return await asyncio.to_thread(functools.partial(sink.apply, records,
                                                             lagging=lagging))
        except (sa.exc.OperationalError, Stale) as e:
            log.warning("database unavailable, retrying in %.1fs: %s", delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)


def create_app(settings: Settings, engine: sa.Engine, *, name: str = PROJECTOR_CONSUMER,
               metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
               within_s: float = BATCH_WITHIN_S,
               linger_s: float = EXECUTION_LINGER_S,
               stream_buffer: int = STREAM_BUFFER) -> faust.App:
    """The projector app. ``name`` is its group id and the owner of its stored offsets.
    With ``metrics_port``, it serves ``/metrics`` there and refreshes its consumer lag.
    ``within_s``: how long a batch of events waits to fill before it is applied; ``linger_s``:
    how much longer a batch of execution reports alone waits (see :func:`lingers`);
    ``stream_buffer``: how many records read ahead it holds (see :data:`STREAM_BUFFER`)."""
    s = settings.log
    faust_dirs = os.path.join(os.path.abspath(settings.data_dir), "faust")
    os.makedirs(faust_dirs, exist_ok=True)  # faust makes its own directory, not the parents
    app = faust.App(
        f"{s.topic_prefix}{name}",
        broker=";".join(f"kafka://{h}" for h in s.bootstrap_servers.split(",")),
        store="memory://",
        # faust keeps a directory per app even with memory stores: under the data directory,
        # not (its default) in the working directory, which was the repository's for tests.
        datadir=os.path.join(faust_dirs, f"{s.topic_prefix}{name}"),
        autodiscover=False,
        web_enabled=False,
        topic_allow_declare=False,      # topics are created by setup, with our partition count
        topic_disable_leader=True,
        topic_partitions=s.partitions,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=s.session_timeout_ms / 1000,
        broker_heartbeat_interval=s.heartbeat_interval_ms / 1000,
        producer_acks=-1,
        stream_wait_empty=False,
        stream_buffer_maxsize=stream_buffer,
        Stream=QuietStream,  # take_events asleep while nothing arrives
    )
    use_transport(app, s.fetch_max_wait_ms)
    sink = Sink(engine, consumer=f"{s.topic_prefix}{name}", commit_behind=True)
    logical = {s.topic(t): t for t in PROJECTED_TOPICS}

    async def seek_to_stored(sender: Any, /, *args: Any, signal: Any, **_: Any) -> None:
        assigned: set[TP] = args[0]
        sink.forget()  # another instance may have written these partitions meanwhile
        positions = await asyncio.to_thread(sink.store.load, sink.consumer,
                                            list(PROJECTED_TOPICS))
        for tp in assigned:
            if tp.topic not in logical:
                continue
            # A partition with no stored position has had nothing applied: it is read from
            # its start, never from the group's committed offset, which faust may have moved
            # past records it took but the projector never applied (a record that stopped
            # it, say).
            await app.consumer.seek(tp, positions.get((logical[tp.topic], tp.partition), 0))
        log.info("projector assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))

    app.on_partitions_assigned.connect(seek_to_stored)

    # One agent over every projected topic: each agent's take_events woke every within_s
    # even with nothing to take (now only once something came: QuietStream), and three of
    # them cost the idle projector ~60 ms of CPU a second. The sink applies records of
    # several partitions and topics in one transaction.
    channel = app.topic(*(s.topic(t) for t in PROJECTED_TOPICS), value_serializer="raw",
                        key_serializer="raw")

    async def project(stream: faust.StreamT[bytes]) -> None:
        # take_events exists on faust-streaming's Stream but not on its StreamT protocol.
        batches = stream.take_events(BATCH_SIZE, within=within_s)  # type: ignore[attr-defined]
        try:
            async for events in batches:
                for part in transactions(events):
                    await apply_part(part)
        except Exception:
            exit_unless_stopped(STOP_GRACE_S)  # faust's shutdown may hang on the broker
            raise

    async def apply_part(events: Sequence[Any]) -> None:
        records, undecodable = _records(events, logical)
        now_ms = time.time_ns() // 1_000_000
        if linger_s > 0 and undecodable is None and lingers(records):
            # Events queue in the stream meanwhile: the next batch takes them all.
            await asyncio.sleep(linger_s)
        started = time.perf_counter()
        applied = await apply_with_retry(sink, records, lagging=lagging(records, now_ms))
        metrics.observe(applied, time.perf_counter() - started)
        log.debug("applied %d/%d records in %d statements", applied.fresh,
                  applied.records, applied.statements)
        if undecodable is not None:
            log.critical("projector stopped at a record that is not an event: %s",
                         undecodable)
            raise undecodable

    # An agent that raised must not be restarted: faust acked its batch, so a new agent would
    # go on after it and the projection would silently miss those records. The process exits
    # instead; a restart seeks to the offsets stored with the projection and stops at the same
    # record, until an operator deals with it.
    app.agent(channel, name="project", supervisor_strategy=CrashingSupervisor)(project)

    async def settle_behind() -> None:
        # A big transaction commits while the next one folds (Sink's commit_behind): when no
        # next one comes, its commit's outcome is waited for here, and a failed one applied
        # again (apply_with_retry), instead of on the next batch.
        while True:
            await asyncio.sleep(SETTLE_BEHIND_S)
            if sink.behind_for() >= SETTLE_BEHIND_S:
                try:
                    await apply_with_retry(sink, [])
                except Exception:
                    log.exception("a transaction committed behind failed; the next batch "
                                  "applies it again")

    app.task(settle_behind)

    if metrics_port is not None:
        def assigned() -> set[tuple[str, int]]:
            return {(logical[tp.topic], tp.partition) for tp in app.consumer.assignment()
                    if tp.topic in logical}

        probe = metrics.LagProbe(s, sink.store, sink.consumer, PROJECTED_TOPICS, assigned)

        async def serve_metrics() -> None:
            async with MetricsServer(metrics_port, host=metrics_host,
                                     refresh=[(metrics.LAG_INTERVAL_S, probe.refresh)]):
                await asyncio.Event().wait()  # until faust cancels the task at shutdown

        app.task(serve_metrics)
    return app
