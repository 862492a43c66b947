"""Rebuild the projections from the log into a fresh database and diff them against the live one.

1. Capture the high watermarks of every topic the projector consumes.
2. Create a fresh database (``<live>_rebuild`` unless named) and run the migrations.
3. Replay each partition from offset 0 to its captured watermark through the projector's sink
   (:mod:`services.audit.replay`), with a progress bar; with more than one lane, each lane is a
   process of its own, so the replay folds on every core.
4. Wait, bounded, until the live projector's applied offsets reach the captured watermarks.
5. Open a consistent snapshot of the live database and read its applied offsets there: the rows
   of the snapshot are exactly the fold of the log up to those offsets (invariant 4). Replay the
   few records the live projector applied past the watermarks, so both sides stand at the same
   offsets even when the system is busy.
6. Diff every projection table (:mod:`services.audit.tables` lists what is not compared and
   why), then drop the rebuilt database unless asked to keep it.

Not compared, because they are not projections of the log:

- tables ``applied_offsets``, ``id_sequences``, ``schema_migrations``, ``callback_deliveries``;
- column ``completions_outbox.published_ms``.

Tokenized counters are compared per logical key, summed over token rows, zero sums as absent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from services.audit.diff import Difference
from services.audit.load import CONNECT_ARGS
from services.audit.replay import (
    BATCH_SIZE,
    Progress,
    ReplayStats,
    SinkTarget,
    Span,
    behind,
    replay,
    replay_processes,
    spans,
)
from services.audit.tables import Comparison
from services.common.log import high_watermarks
from services.common.settings import DatabaseSettings, Settings, projector_consumer
from services.projector.app import PROJECTED_TOPICS
from services.projector.sink import Sink
from sql.migrate import apply_migrations

SUFFIX = "_rebuild"
MAX_NAME = 64  # MySQL's limit on database names
_APPLIED = sa.text("SELECT topic, kafka_partition, next_offset FROM applied_offsets "
                   "WHERE consumer = :c")


class AuditError(Exception):
    """The audit could not run to a verdict (as opposed to finding differences)."""


def default_database(live: str) -> str:
    """The rebuilt database's name: the live one plus a suffix, within MySQL's 64 characters."""
    return live[:MAX_NAME - len(SUFFIX)] + SUFFIX


@dataclass
class RebuildOptions:
    """How :func:`rebuild` runs."""

    database: str | None = None
    """The rebuilt database (must not exist); default :func:`default_database`."""
    keep: bool = False
    """Keep the rebuilt database afterwards."""
    wait_s: float = 120.0
    """How long to wait for the live projector to reach the captured watermarks."""
    batch_size: int = BATCH_SIZE
    lanes: int = 1
    """Partitions replayed at the same time, each lane in a process of its own when more than
    one (each partition stays in one lane, in order)."""
    bulk: bool = True
    """Fold batches of the common lifecycle a batch at a time (:mod:`services.audit.bulk`)."""


@dataclass
class RebuildResult:
    """What a rebuild found."""

    database: str
    kept: bool
    marks: dict[tuple[str, int], int]
    """The high watermarks captured at the start."""
    offsets: dict[tuple[str, int], int]
    """Where both sides stood when compared (the live snapshot's applied offsets)."""
    replay: ReplayStats
    catch_up: ReplayStats
    tables: int = 0
    differences: list[Difference] = field(default_factory=list)


class Reporter:
    """What :func:`rebuild` tells its user; the CLI renders it with rich, tests ignore it."""

    def message(self, text: str) -> None:
        """A line of progress news."""

    def replaying(self, todo: list[Span], title: str) -> Progress | None:
        """Start showing a replay of ``todo``; the callback advances it."""
        return None

    def done_replaying(self) -> None:
        """The replay started by :meth:`replaying` ended."""

    def difference(self, d: Difference) -> None:
        """A difference was found (called as they are found)."""


def _engine(db: DatabaseSettings, **kwargs: object) -> sa.Engine:
    return sa.create_engine(db.url(), poolclass=NullPool, **kwargs)


def _server(db: DatabaseSettings) -> sa.Engine:
    return sa.create_engine(db.url(database=False), poolclass=NullPool,
                            isolation_level="AUTOCOMMIT")


def database_exists(db: DatabaseSettings, name: str) -> bool:
    engine = _server(db)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT COUNT(*) FROM information_schema.SCHEMATA "
                                        "WHERE SCHEMA_NAME = :n"), {"n": name}).scalar() == 1
    finally:
        engine.dispose()


def drop_database(db: DatabaseSettings, name: str) -> None:
    if "`" in name:
        raise AuditError(f"bad database name {name!r}")
    engine = _server(db)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        engine.dispose()


def _applied(conn: sa.Connection, consumer: str, topics: tuple[str, ...]
             ) -> dict[tuple[str, int], int]:
    return {(str(t), int(p)): int(n) for t, p, n in conn.execute(_APPLIED, {"c": consumer})
            if t in topics}


async def _wait_for_live(engine: sa.Engine, consumer: str, marks: Mapping[tuple[str, int], int],
                         wait_s: float, reporter: Reporter) -> None:
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        with engine.connect() as conn:
            lag = behind(marks, _applied(conn, consumer, PROJECTED_TOPICS))
        if not lag:
            return
        total = sum(lag.values())
        if time.monotonic() >= deadline:
            parts = ", ".join(f"{t}[{p}]: {n}" for (t, p), n in sorted(lag.items()))
            raise AuditError(
                f"the live projector ({consumer!r}) is still {total} events behind the log end "
                f"captured at the start after waiting {wait_s:.0f} s ({parts}); is it running? "
                "Diffing now would report its lag as differences.")
        if not told:
            reporter.message(f"waiting up to {wait_s:.0f} s for the live projector to apply "
                             f"{total} more events on {len(lag)} partitions")
            told = True
        await asyncio.sleep(0.25)


async def rebuild(settings: Settings, options: RebuildOptions | None = None,
                  reporter: Reporter | None = None) -> RebuildResult:
    """Rebuild the projections from the log and diff them against the live database.

    Raises:
        AuditError: the target database exists or is the live one, the live database is
            missing, or the live projector did not catch up in time.
        services.common.log.LogError: the log could not be read.
    """
    options = options or RebuildOptions()
    reporter = reporter or Reporter()
    live_db = settings.db
    target = options.database or default_database(live_db.name)
    if target == live_db.name:
        raise AuditError(f"the rebuilt database cannot be the live one ({target!r})")
    if not database_exists(live_db, live_db.name):
        raise AuditError(f"the live database {live_db.name!r} does not exist")
    if database_exists(live_db, target):
        raise AuditError(f"database {target!r} exists already: drop it, or name another one "
                         "with --database")
    consumer = projector_consumer(settings.log)
    marks = await high_watermarks(settings.log, PROJECTED_TOPICS)
    reporter.message(f"log end captured: {sum(marks.values())} events on {len(marks)} "
                     f"partitions of {', '.join(PROJECTED_TOPICS)}")
    rebuilt_db = msgspec.structs.replace(live_db, name=target)
    # Pooled: a new connection per replayed transaction would cost more than the transaction.
    # Its connections may load files (services/audit/load.py).
    rebuilt = sa.create_engine(rebuilt_db.url(), pool_size=2, max_overflow=1,
                               connect_args=CONNECT_ARGS)
    live = _engine(live_db, isolation_level="REPEATABLE READ")
    try:
        apply_migrations(rebuilt_db)
        sink = Sink(rebuilt, consumer=consumer)
        todo = spans({}, marks, PROJECTED_TOPICS)
        progress = reporter.replaying(todo, f"replaying into {target}")
        try:
            if options.lanes > 1:
                stats = await replay_processes(
                    settings.log, SinkTarget(rebuilt_db, consumer), todo,
                    batch_size=options.batch_size, processes=options.lanes, progress=progress,
                    bulk=options.bulk)
            else:
                stats = await replay(settings.log, sink, todo, batch_size=options.batch_size,
                                     progress=progress, bulk=options.bulk)
        finally:
            reporter.done_replaying()
        reporter.message(f"replayed {stats.events} events in {stats.wall_s:.1f} s "
                         f"({stats.events_per_s:,.0f} events/s)")
        await _wait_for_live(live, consumer, marks, options.wait_s, reporter)
        with live.connect() as live_conn:
            # Everything read on live_conn from here on is one snapshot: the rows and the
            # offsets they were folded up to (stored in the same transactions).
            live_conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            offsets = _applied(live_conn, consumer, PROJECTED_TOPICS)
            extra = spans(marks, offsets, PROJECTED_TOPICS)
            catch_up = ReplayStats()
            if extra:
                reporter.message(f"the live projector is past the captured log end: catching "
                                 f"up {sum(s.size for s in extra)} events")
                catch_up = await replay(settings.log, sink, extra,
                                        batch_size=options.batch_size)
            result = RebuildResult(target, options.keep, dict(marks), offsets, stats, catch_up)
            reporter.message("comparing projection tables")
            with rebuilt.connect() as rebuilt_conn:
                comparison = Comparison(live_conn, live_db.name, rebuilt_conn, target)
                for d in comparison:
                    result.differences.append(d)
                    reporter.difference(d)
                result.tables = comparison.tables
            live_conn.rollback()
        return result
    finally:
        rebuilt.dispose()
        live.dispose()
        if not options.keep:
            drop_database(live_db, target)
