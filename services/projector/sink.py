"""The projector's sink: applies a batch of records exactly once, in one transaction.

Records are grouped by partition (order within a partition is kept, and partitions are
independent); each partition writes tokenized counters under its own token, the partition
number, so concurrent projector instances never write the same counter row.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
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


BEHIND_MIN_JOBS = 1_000
"""Jobs' worth of records (:func:`weight`) from which a transaction of a sink that commits
behind (``commit_behind``) is committed while the next one folds; smaller ones commit before
``apply`` returns, as every transaction did. A projector behind a backlog takes thousands
of jobs a transaction, and its Python and MariaDB took turns: one folded while the other
wrote (``bench catchup``: the machine 52% busy)."""


def weight(event: object) -> int:
    """About how many jobs' rows a record's event writes: a bunch's attempts or jobs, else 1."""
    many = getattr(event, "attempts", None)
    if many is None:
        many = getattr(event, "jobs", None)
    return len(many) if many else 1


class Stale(Exception):
    """A transaction folded on the positions the one before it was to store found others."""


@dataclass
class _Behind:
    """A transaction whose statements and COMMIT are queued on the sink's chain."""

    conn: sa.Connection
    records: list[Record]
    """Every record its ``apply`` was given: applied again if the commit fails."""
    done: Future[None]
    since: float


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
                 max_cached_jobs: int = DEFAULT_MAX_JOBS, commit_behind: bool = False) -> None:
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
        # Committing behind (one applying thread at a time: the projector's agent).
        self._commit_behind = commit_behind
        self._lock = threading.Lock()
        self._chain = Pipeline()
        """Every statement of every transaction in order, so one runs only after the one
        before it committed."""
        self._behind: _Behind | None = None
        self._positions: dict[tuple[str, int], int] = {}
        """Next offsets as the last transaction queued will store them (generation below)."""
        self._positions_generation = 0
        self._redo: list[Record] = []
        self._lagging = True
        """Records of a transaction committed behind whose commit failed: applied first."""

    def forget(self) -> None:
        """Drop everything cached before its partition's next transaction: partitions were
        (re)assigned, so another instance may have written them meanwhile. Safe to call from
        any thread: each partition's own applying thread does the dropping."""
        self._generation += 1

    @property
    def store(self) -> MySQLOffsetStore:
        return self._store

    def behind_for(self) -> float:
        """Seconds since the transaction committing behind was queued (0: none is)."""
        behind = self._behind
        return 0.0 if behind is None else time.monotonic() - behind.since

    def apply(self, records: Sequence[Record], *, lagging: bool = True) -> Applied:
        """Apply the records not applied before; their offsets are stored in the same commit.

        A sink made with ``commit_behind`` may return while a big transaction (of records the
        caller says are ``lagging`` behind the log) has its statements
        and commit still run: the next ``apply`` folds meanwhile and waits for that commit
        before it queues its own, and raises that commit's failure (the retried call applies
        the failed transaction's records first). ``apply([])`` waits for it.
        """
        if self._commit_behind:
            with self._lock:
                self._lagging = lagging
                return self._apply_chained(list(records))
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

    def _apply_chained(self, records: list[Record]) -> Applied:
        redo, self._redo = self._redo, []
        try:
            if redo:
                self._settle()  # none is behind once a commit failed; for clarity
                return self._apply_locked([*redo, *records], len(records))
            if not records:
                self._settle()
                return Applied()
            expected = self._expected(records)
            if expected is None:
                self._settle()
                return self._apply_locked(records, len(records))
            return self._apply_ahead(records, expected)
        except BaseException:
            self._redo = redo + self._redo  # the failed commit's records came after redo's
            raise

    def _expected(self, records: list[Record]) -> dict[tuple[str, int], int] | None:
        """The positions the transaction behind will store, if one is behind and they cover
        every partition of ``records``."""
        if self._behind is None or self._positions_generation != self._generation:
            return None
        try:
            return {key: self._positions[key] for key in {(r.topic, r.partition)
                                                          for r in records}}
        except KeyError:
            return None

    def _settle(self) -> None:
        """Wait for the transaction behind to commit; its failure is raised, its records kept
        to apply first."""
        behind, self._behind = self._behind, None
        if behind is None:
            return
        try:
            self._chain.settled(behind.done)
        except BaseException:
            self._failed(behind)
            raise
        behind.conn.close()

    def _failed(self, behind: _Behind | None, *conns: sa.Connection) -> None:
        """After a failure on the chain: nothing queued runs any more, the connections roll
        back, and every cache and position is dropped (folds ran on the failed one's).
        ``behind``: a transaction an earlier ``apply`` returned for, whose commit failed: its
        records are applied first next time (the failed call's own are its caller's to
        retry)."""
        self._chain.drain()
        for conn in (*conns, *([behind.conn] if behind else [])):
            conn.close()  # rolls back what it did not commit
        if behind is not None:
            self._redo += behind.records
        for cache in self._caches.values():
            cache.clear()
        self._positions.clear()

    def _apply_locked(self, records: list[Record], given: int) -> Applied:
        """Lock the stored positions first (none is behind), then fold; a big transaction is
        committed behind."""
        conn = self.engine.connect()
        try:
            trans = conn.begin()
            stored = self._store.lock(conn, self.consumer, {(r.topic, r.partition)
                                                           for r in records})
            fresh = [r for r in records if r.offset >= stored[(r.topic, r.partition)]]
            if not fresh:
                trans.commit()
                conn.close()
                return Applied(records=given)
            return self._finish(conn, trans, records, fresh, given, stored)
        except BaseException:
            self._failed(None, conn)
            raise

    def _apply_ahead(self, records: list[Record], expected: dict[tuple[str, int], int]
                     ) -> Applied:
        """Fold while the transaction behind commits, on the positions it is to store; the
        chain checks them (locked) before this transaction's first statement runs."""
        behind = self._behind
        assert behind is not None
        fresh = [r for r in records if r.offset >= expected[(r.topic, r.partition)]]
        if not fresh:  # in the transaction behind, or before it
            self._settle()
            return Applied(records=len(records))
        conn = self.engine.connect()
        try:
            trans = conn.begin()
            self._chain.submit(functools.partial(self._check, conn, expected))
            return self._finish(conn, trans, records, fresh, len(records), expected,
                                behind=behind)
        except BaseException:
            self._behind = None
            self._chain.drain()
            if behind.done.exception() is None:
                behind.conn.close()  # committed: only this one failed
                self._failed(None, conn)
            else:
                self._failed(behind, conn)
            raise

    def _check(self, conn: sa.Connection, expected: dict[tuple[str, int], int]) -> None:
        stored = self._store.lock(conn, self.consumer, list(expected))
        if stored != expected:
            raise Stale(f"positions {stored} where the transaction before stored {expected}")

    def _finish(self, conn: sa.Connection, trans: sa.RootTransaction, records: list[Record],
                fresh: list[Record], given: int, start: dict[tuple[str, int], int],
                behind: _Behind | None = None) -> Applied:
        """Fold ``fresh`` on the chain, store the positions and commit: behind if the
        transaction is big, else before returning. ``behind``: the transaction before, whose
        commit this one waits for before it may be behind in turn."""
        later = self._lagging and sum(weight(r.envelope.event) for r in fresh
                                      ) >= BEHIND_MIN_JOBS
        stats = self._fold_with(Writer(conn, self._chain), conn, fresh, wait=False)
        ends = dict(start)
        for r in fresh:
            ends[(r.topic, r.partition)] = max(ends[(r.topic, r.partition)], r.offset + 1)
        self._chain.submit(functools.partial(self._store.save, conn, self.consumer, ends))
        done = self._chain.submit(trans.commit)
        if behind is not None:
            self._chain.settled(behind.done)  # raises its failure: this one is skipped
        if behind is not None:
            behind.conn.close()
            self._behind = None
        if not later:
            self._chain.settled(done)  # a failure: the caller's except rolls this one back
            conn.close()
        else:
            self._behind = _Behind(conn, records, done, time.monotonic())
            self._positions.update(ends)
            self._positions_generation = self._generation
        stats.records, stats.fresh = given, len(fresh)
        return stats

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

    def _fold_with(self, writer: Writer, conn: sa.Connection, records: list[Record], *,
                   wait: bool = True) -> Applied:
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
        writer.flush(wait=wait)
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
