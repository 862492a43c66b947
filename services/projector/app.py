"""The projector as a faust-streaming app: thin agents that hand event batches to the sink.

Each agent takes events in batches (``take_events``: one event at a time is ten times slower)
and applies them with :class:`~services.projector.sink.Sink` in one MySQL transaction that also
stores the offsets. Faust still commits offsets to Kafka, but the database is the truth: on
every assignment the consumer seeks each partition to the offset stored with the projection, so
a crash between the MySQL commit and Kafka's never re-applies or loses a record. A record that
cannot be applied (not an event, or an error other than the database being unreachable) stops
the process with a non-zero exit after what precedes it in its batch is applied: it is never
skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import faust
import sqlalchemy as sa
from faust.types import TP
from mode import CrashingSupervisor

from schemas import codec
from schemas import topics as logical_topics
from services.common.log import Record
from services.common.metrics import MetricsServer
from services.common.settings import PROJECTOR_CONSUMER, Settings
from services.projector import metrics
from services.projector.sink import Applied, Sink
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


def batch_within_s(env: Mapping[str, str]) -> float:
    """The batch wait :data:`BATCH_WITHIN_ENV` asks for, in seconds (default
    :data:`BATCH_WITHIN_S`); ValueError, saying why, for a value that is not 0-5000 ms."""
    raw = env.get(BATCH_WITHIN_ENV)
    if raw is None or raw == "":
        return BATCH_WITHIN_S
    try:
        ms = int(raw)
    except ValueError:
        raise ValueError(f"{BATCH_WITHIN_ENV} must be whole milliseconds, not {raw!r}") from None
    if not 0 <= ms <= 5_000:
        raise ValueError(f"{BATCH_WITHIN_ENV} must be between 0 and 5000 ms, not {ms}")
    return ms / 1000


def _records(events: Iterable[Any], logical: dict[str, str]
             ) -> tuple[list[Record], codec.DecodeError | None]:
    """The records of a batch of events, up to the first that is not an envelope, and the
    error naming that one's position (None if every event decoded)."""
    out: list[Record] = []
    for ev in events:
        m = ev.message
        try:
            env = codec.decode(m.value)
        except codec.DecodeError as e:
            return out, codec.DecodeError(f"{m.topic}[{m.partition}]@{m.offset}: {e}")
        out.append(Record(logical[m.topic], m.partition, m.offset, env))
    return out, None


async def apply_with_retry(sink: Sink, records: list[Record], *, first_delay_s: float = 0.2,
                           max_delay_s: float = 10.0) -> Applied:
    """Apply records, retrying while the database is unreachable.

    Retrying is safe: the sink skips what a failed attempt may have committed (offsets are
    stored with the rows). Other errors (a bug, a constraint violation) are not retried: they
    stop the projector process (see the module docstring) rather than skip a record.
    """
    delay = first_delay_s
    while True:
        try:
            return await asyncio.to_thread(sink.apply, records)
        except sa.exc.OperationalError as e:
            log.warning("database unavailable, retrying in %.1fs: %s", delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)


def create_app(settings: Settings, engine: sa.Engine, *, name: str = PROJECTOR_CONSUMER,
               metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
               within_s: float = BATCH_WITHIN_S) -> faust.App:
    """The projector app. ``name`` is its group id and the owner of its stored offsets.
    With ``metrics_port``, it serves ``/metrics`` there and refreshes its consumer lag.
    ``within_s``: how long a batch of events waits to fill before it is applied."""
    s = settings.log
    app = faust.App(
        f"{s.topic_prefix}{name}",
        broker=";".join(f"kafka://{h}" for h in s.bootstrap_servers.split(",")),
        store="memory://",
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
    )
    use_transport(app, s.fetch_max_wait_ms)
    sink = Sink(engine, consumer=f"{s.topic_prefix}{name}")
    logical = {s.topic(t): t for t in PROJECTED_TOPICS}

    async def seek_to_stored(sender: Any, /, *args: Any, signal: Any, **_: Any) -> None:
        assigned: set[TP] = args[0]
        sink.forget()  # another instance may have written these partitions meanwhile
        positions = await asyncio.to_thread(sink.store.load, sink.consumer,
                                            list(PROJECTED_TOPICS))
        for tp in assigned:
            position = positions.get((logical.get(tp.topic, ""), tp.partition))
            if position is not None:
                await app.consumer.seek(tp, position)
        log.info("projector assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))

    app.on_partitions_assigned.connect(seek_to_stored)

    for topic in PROJECTED_TOPICS:
        channel = app.topic(s.topic(topic), value_serializer="raw", key_serializer="raw")

        async def project(stream: faust.StreamT[bytes]) -> None:
            # take_events exists on faust-streaming's Stream but not on its StreamT protocol.
            batches = stream.take_events(BATCH_SIZE, within=within_s)  # type: ignore[attr-defined]
            async for events in batches:
                records, undecodable = _records(events, logical)
                started = time.perf_counter()
                applied = await apply_with_retry(sink, records)
                metrics.observe(applied, time.perf_counter() - started)
                log.debug("applied %d/%d records in %d statements", applied.fresh,
                          applied.records, applied.statements)
                if undecodable is not None:
                    log.critical("projector stopped at a record that is not an event: %s",
                                 undecodable)
                    raise undecodable

        project.__name__ = f"project_{topic.replace('-', '_')}"
        # An agent that raised must not be restarted: faust acked its batch, so a new agent
        # would go on after it and the projection would silently miss those records. The
        # process exits instead; a restart seeks to the offsets stored with the projection and
        # stops at the same record, until an operator deals with it.
        app.agent(channel, name=project.__name__, supervisor_strategy=CrashingSupervisor)(project)

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
