"""The projector's sink: applies a batch of records exactly once, in one transaction.

Records are grouped by partition (order within a partition is kept, and partitions are
independent); each partition writes tokenized counters under its own token, the partition
number, so concurrent projector instances never write the same counter row.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from services.common.log import Record
from services.common.offsets import MySQLOffsetStore
from services.projector.handlers import Handler
from services.projector.state import DEFAULT_MAX_JOBS, PartitionCache
from services.projector.writer import Pipeline, Writer

log = logging.getLogger(__name__)

FOLD_CHUNK = 500
"""Records of a partition folded before the writer hands what they wrote to its pipeline and
folds on: a transaction of more than this many records (a projector that fell behind takes
up to 2,000 a batch) keeps MariaDB busy with one chunk's statements while its Python folds the
next, instead of the two taking turns. A projector behind a run of no-op jobs caught up in
about twice the time its own CPU took, as both waited on each other (docs/performance.md,
"The projector's tail")."""


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

    def __init__(self, engine: sa.Engine, consumer: str, *,
                 max_cached_jobs: int = DEFAULT_MAX_JOBS) -> None:
        self._store = MySQLOffsetStore(engine)
        self.engine = engine
        self.consumer = consumer
        self._max_cached_jobs = max_cached_jobs
        # What each partition's handlers keep between transactions (services/projector/
        # state.py). A partition is applied by one thread at a time (the projector's agent, or
        # one replay lane), so each cache is only ever used by one thread at once.
        self._caches: dict[tuple[str, int], PartitionCache] = {}
        self._generation = 0
        """Bumped by forget(); a cache from an older generation is dropped before use."""
        self._seen: dict[tuple[str, int], int] = {}
        self._pipelines = threading.local()

    def forget(self) -> None:
        """Drop everything cached before its partition's next transaction: partitions were
        (re)assigned, so another instance may have written them meanwhile. Safe to call from
        any thread: each partition's own applying thread does the dropping."""
        self._generation += 1

    @property
    def store(self) -> MySQLOffsetStore:
        return self._store

    def apply(self, records: Sequence[Record]) -> Applied:
        """Apply the records not applied before; their offsets are stored in the same commit."""
        if not records:
            return Applied()
        try:
            fresh, stats = self._store.apply(self.consumer, records, self._fold)
        except BaseException:
            # What this transaction folded into the caches never reached the database.
            for key in {(r.topic, r.partition) for r in records}:
                self._cache(key).clear()
            raise
        result = stats or Applied()
        result.records, result.fresh = len(records), fresh
        return result

    def _pipeline(self) -> Pipeline:
        """The applying thread's own statement pipeline (replay lanes apply in parallel)."""
        pipeline: Pipeline | None = getattr(self._pipelines, "pipeline", None)
        if pipeline is None:
            pipeline = self._pipelines.pipeline = Pipeline()
        return pipeline

    def _fold(self, conn: sa.Connection, records: list[Record]) -> Applied:
        pipeline = self._pipeline()
        try:
            return self._fold_with(Writer(conn, pipeline), conn, records)
        except BaseException:
            pipeline.drain()  # the statements still running use conn: before the rollback
            raise

    def _fold_with(self, writer: Writer, conn: sa.Connection, records: list[Record]
                   ) -> Applied:
        stats = Applied()
        by_partition: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for r in records:
            by_partition[(r.topic, r.partition)].append(r)
        for (topic, partition), part in sorted(by_partition.items()):
            cache = self._cache((topic, partition))
            handler = Handler(conn, writer, token=partition, cache=cache)
            handler.prepare([r.envelope for r in part])
            for start in range(0, len(part), FOLD_CHUNK):
                if start:
                    writer.flush(wait=False)  # runs beside the next chunk's fold
                for r in part[start:start + FOLD_CHUNK]:
                    if not handler.handle(r.envelope):
                        stats.skipped_tags += 1
            handler.settle()  # the outbox rows of this partition's completions
            cache.trim(self._max_cached_jobs // len(self._caches))
        writer.flush()
        stats.statements = writer.statements
        stats.by_tag = Counter(r.envelope.tag for r in records)
        return stats

    def _cache(self, key: tuple[str, int]) -> PartitionCache:
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches.setdefault(key, PartitionCache())
        generation = self._generation
        if self._seen.get(key) != generation:
            cache.clear()  # new, or from before a forget()
            self._seen[key] = generation
        return cache
