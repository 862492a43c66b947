"""Consumer positions stored in the projection database: the tracking-record pattern.

A projector applies a batch of records and stores, in the *same* transaction, the next offset of
each (topic, partition) it touched. Before applying, it locks those rows and drops records below
the stored offsets. Re-delivery after a crash, a restart or a rebalance therefore never applies a
record twice, and a record is never lost: exactly-once in effect (DESIGN invariant 4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import sqlalchemy as sa

from services.common.log import Record

T = TypeVar("T")

_LOAD = sa.text(
    "SELECT topic, kafka_partition, next_offset FROM applied_offsets "
    "WHERE consumer = :consumer AND topic IN :topics"
).bindparams(sa.bindparam("topics", expanding=True))
_ENSURE = sa.text(
    "INSERT IGNORE INTO applied_offsets (consumer, topic, kafka_partition, next_offset, "
    "updated_at_ms) VALUES (:consumer, :topic, :partition, 0, :now)"
)
_LOCK = sa.text(
    "SELECT topic, kafka_partition, next_offset FROM applied_offsets "
    "WHERE consumer = :consumer AND topic = :topic AND kafka_partition = :partition FOR UPDATE"
)
_SAVE = sa.text(
    "UPDATE applied_offsets SET next_offset = :next_offset, updated_at_ms = :now "
    "WHERE consumer = :consumer AND topic = :topic AND kafka_partition = :partition"
)


class MySQLOffsetStore:
    """Reads and writes ``applied_offsets`` through a SQLAlchemy engine."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def load(self, consumer: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        """The next offset to read of each (topic, partition) ``consumer`` has applied."""
        if not topics:
            return {}
        with self._engine.connect() as conn:
            rows = conn.execute(_LOAD, {"consumer": consumer, "topics": list(topics)})
            return {(t, int(p)): int(o) for t, p, o in rows}

    def apply(self, consumer: str, records: Sequence[Record],
              effect: Callable[[sa.Connection, list[Record]], T]) -> tuple[int, T | None]:
        """Apply the records not yet applied, and store their offsets, in one transaction.

        ``effect`` receives the connection and the fresh records (in the given order) and
        writes the projection rows. Returns how many records were fresh and what ``effect``
        returned (``None`` when nothing was fresh and ``effect`` was not called).
        """
        now = time.time_ns() // 1_000_000
        parts = sorted({(r.topic, r.partition) for r in records})
        with self._engine.begin() as conn:
            stored: dict[tuple[str, int], int] = {}
            for topic, partition in parts:  # sorted: a fixed lock order, so no deadlocks
                key = {"consumer": consumer, "topic": topic, "partition": partition}
                conn.execute(_ENSURE, {**key, "now": now})
                row = conn.execute(_LOCK, key).one()
                stored[(topic, partition)] = int(row.next_offset)
            fresh = [r for r in records if r.offset >= stored[(r.topic, r.partition)]]
            if not fresh:
                return 0, None
            result = effect(conn, fresh)
            ends: dict[tuple[str, int], int] = {}
            for r in fresh:
                ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0),
                                                   r.offset + 1)
            conn.execute(_SAVE, [
                {"consumer": consumer, "topic": t, "partition": p, "next_offset": o, "now": now}
                for (t, p), o in ends.items()
            ])
            return len(fresh), result

    def lock(self, conn: sa.Connection, consumer: str, parts: Iterable[tuple[str, int]]
             ) -> dict[tuple[str, int], int]:
        """Lock ``consumer``'s positions on ``parts`` in ``conn``'s transaction (made if
        missing, at 0) and return them: what :meth:`apply` does first."""
        now = time.time_ns() // 1_000_000
        stored: dict[tuple[str, int], int] = {}
        for topic, partition in sorted(parts):  # sorted: a fixed lock order, so no deadlocks
            key = {"consumer": consumer, "topic": topic, "partition": partition}
            conn.execute(_ENSURE, {**key, "now": now})
            stored[(topic, partition)] = int(conn.execute(_LOCK, key).one().next_offset)
        return stored

    def save(self, conn: sa.Connection, consumer: str, ends: dict[tuple[str, int], int]
             ) -> None:
        """Store ``consumer``'s next offsets, in ``conn``'s transaction (after :meth:`lock`)."""
        now = time.time_ns() // 1_000_000
        conn.execute(_SAVE, [
            {"consumer": consumer, "topic": t, "partition": p, "next_offset": o, "now": now}
            for (t, p), o in ends.items()])

    def set_position(self, conn: sa.Connection, consumer: str, topic: str, partition: int,
                     next_offset: int) -> None:
        """Store ``next_offset`` as ``consumer``'s position on one partition, on ``conn`` (in
        the caller's transaction): for a writer that applied the records another way."""
        now = time.time_ns() // 1_000_000
        key = {"consumer": consumer, "topic": topic, "partition": partition}
        conn.execute(_ENSURE, {**key, "now": now})
        conn.execute(_SAVE, {**key, "next_offset": next_offset, "now": now})
