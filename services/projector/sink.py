"""The projector's sink: applies a batch of records exactly once, in one transaction.

Records are grouped by partition (order within a partition is kept, and partitions are
independent); each partition writes tokenized counters under its own token, the partition
number, so concurrent projector instances never write the same counter row.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from services.common.log import Record
from services.common.offsets import MySQLOffsetStore
from services.projector.handlers import Handler
from services.projector.writer import Writer

log = logging.getLogger(__name__)


@dataclass
class Applied:
    """What one call of :meth:`Sink.apply` did."""

    records: int = 0
    fresh: int = 0
    skipped_tags: int = 0
    statements: int = 0
    by_tag: dict[str, int] = field(default_factory=dict)
    """Fresh records per event tag (for metrics)."""


class Sink:
    """Folds records into the projection database, storing offsets with the rows."""

    def __init__(self, engine: sa.Engine, consumer: str) -> None:
        self._store = MySQLOffsetStore(engine)
        self.consumer = consumer

    @property
    def store(self) -> MySQLOffsetStore:
        return self._store

    def apply(self, records: Sequence[Record]) -> Applied:
        """Apply the records not applied before; their offsets are stored in the same commit."""
        if not records:
            return Applied()
        fresh, stats = self._store.apply(self.consumer, records, self._fold)
        result = stats or Applied()
        result.records, result.fresh = len(records), fresh
        return result

    def _fold(self, conn: sa.Connection, records: list[Record]) -> Applied:
        writer = Writer(conn)
        stats = Applied()
        by_partition: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for r in records:
            by_partition[(r.topic, r.partition)].append(r)
        for (_, partition), part in sorted(by_partition.items()):
            handler = Handler(conn, writer, token=partition)
            handler.prepare([r.envelope for r in part])
            for r in part:
                if not handler.handle(r.envelope):
                    stats.skipped_tags += 1
            handler.settle()  # the outbox rows of this partition's completions
        writer.flush()
        stats.statements = writer.statements
        stats.by_tag = Counter(r.envelope.tag for r in records)
        return stats
