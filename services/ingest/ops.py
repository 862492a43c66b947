"""Operations reads: what the ops dashboard (and anything else, e.g. metrics) shows.

A read repository: SQL over the projections and the broker's high watermarks in, plain structs
out; no HTML here. Every read is system-wide (all users), so callers decide who may see it.

- Rates: SJ, MJS, MJC and job cancellations per minute over the last 5 and 15 minutes, from
  the tokenized ``event_rates`` counters the projector keeps per minute of the events' times:
  one range read of the primary key, summed over tokens (O(minutes x kinds x tokens) rows,
  whatever the size of the projection). A window is its last minutes up to now, the current
  one partly, and its rates divide by the time it covers.
- Consumer lag: the approach of ``services/stack/status.py``: ``applied_offsets`` (the next
  offset each consumer applies) against the partitions' high watermarks from fetch responses.
- Cores: the tokenized ``user_inst_coll_resources`` counters, summed over their tokens.
- Instances by pool and state (the ``instances`` projection of the scheduler topic's instance
  events; free cores are what active instances offer as of their last instance event, see
  ``sql/009-event-rates.sql``) and the instances running attempts now (from attempts and jobs).
- Recent cancellations; callbacks and completions not yet delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from aiokafka.errors import KafkaError

from core.projection.instances import MINUTE_MS
from core.projection.instances import RATE_KINDS as RATE_KIND_OF
from services.common.log import LogError, high_watermarks
from services.common.settings import LogSettings
from services.ingest.store import Store

WINDOWS_MIN = (5, 15)
RATE_KINDS = tuple(RATE_KIND_OF.values())
_RATES = ("SELECT minute, kind, SUM(n) AS n FROM event_rates WHERE minute >= :since "
          "AND minute <= :now GROUP BY minute, kind")
_OFFSETS = ("SELECT consumer, topic, kafka_partition, next_offset, updated_at_ms "
            "FROM applied_offsets ORDER BY consumer, topic, kafka_partition")
_CORES = (
    "SELECT {key} AS name, SUM(n_ready_jobs) AS n_ready, SUM(ready_cores_mcpu) AS ready_mcpu, "
    "SUM(n_running_jobs) AS n_running, SUM(running_cores_mcpu) AS running_mcpu, "
    "SUM(n_creating_jobs) AS n_creating FROM user_inst_coll_resources "
    "GROUP BY {key} ORDER BY {key}")
_INSTANCES = (
    "SELECT inst_coll, state, COUNT(*) AS n, SUM(cores_mcpu) AS cores_mcpu, "
    "SUM(free_cores_mcpu) AS free_mcpu FROM instances WHERE state <> 'deleted' "
    "GROUP BY inst_coll, state ORDER BY inst_coll, state")
# Instances that run attempts now, from the execution projection (attempts and jobs).
_BUSY = (
    "SELECT j.inst_coll, a.instance_name, COUNT(*) AS n, SUM(j.cores_mcpu) AS cores_mcpu, "
    "MIN(a.start_time_ms) AS since_ms FROM attempts a JOIN jobs j ON j.batch_id = a.batch_id "
    "AND j.job_id = a.job_id WHERE a.end_time_ms IS NULL AND a.start_time_ms IS NOT NULL "
    "AND a.instance_name IS NOT NULL GROUP BY j.inst_coll, a.instance_name "
    "ORDER BY j.inst_coll, a.instance_name")
_DELETED = "SELECT COUNT(*) FROM instances WHERE state = 'deleted'"
_CANCELLED = (
    "SELECT x.batch_id, x.job_group_id, x.reason, x.time_cancelled_ms, b.user, "
    "b.billing_project FROM ({inner}) x JOIN batches b ON b.id = x.batch_id "
    "ORDER BY x.time_cancelled_ms DESC, x.batch_id DESC, x.job_group_id LIMIT :n")
_CANCELLED_INNER = (
    "(SELECT batch_id, 0 AS job_group_id, reason, time_cancelled_ms FROM batches_cancelled "
    " ORDER BY time_cancelled_ms DESC LIMIT :n) UNION ALL "
    "(SELECT c.batch_id, c.job_group_id, c.reason, c.time_cancelled_ms FROM "
    " job_groups_cancelled c JOIN job_groups g ON g.batch_id = c.batch_id "
    " AND g.job_group_id = c.job_group_id WHERE c.job_group_id <> 0 "
    # only the group the cancel named, not each descendant it reached
    " AND NOT EXISTS (SELECT 1 FROM job_groups_cancelled p WHERE p.batch_id = c.batch_id "
    "  AND p.job_group_id = g.parent_id AND p.time_cancelled_ms <= c.time_cancelled_ms) "
    " ORDER BY c.time_cancelled_ms DESC LIMIT :n)")
_CALLBACKS = ("SELECT status, COUNT(*) AS n, MIN(time_created_ms) AS oldest_ms "
              "FROM callback_deliveries GROUP BY status ORDER BY status")
_CALLBACKS_OWED = (
    "SELECT idempotency_key, batch_id, job_group_id, url, status, attempts, next_attempt_ms, "
    "last_error, time_created_ms FROM callback_deliveries WHERE status <> 'delivered' "
    "ORDER BY time_created_ms LIMIT :n")
_OUTBOX = ("SELECT COUNT(*) AS n, MIN(time_completed_ms) AS oldest_ms FROM completions_outbox "
           "WHERE published_ms IS NULL")


class Rate(msgspec.Struct, frozen=True, kw_only=True):
    window_min: int
    covered_min: float  # the time the window's minutes cover up to now (the last one partly)
    counts: dict[str, int]  # events per kind (RATE_KINDS) in the window

    def count(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    def per_min(self, kind: str) -> float:
        return self.count(kind) / self.covered_min

    @property
    def sj(self) -> int:
        return self.count("SJ")

    @property
    def mjs(self) -> int:
        return self.count("MJS")

    @property
    def mjc(self) -> int:
        return self.count("MJC")


class Rates(msgspec.Struct, frozen=True, kw_only=True):
    windows: list[Rate]
    kinds: tuple[str, ...] = RATE_KINDS  # the columns to show, in order


def rate_windows(rows: Iterable[tuple[int, str, int]], now_ms: int,
                 windows: Sequence[int] = WINDOWS_MIN) -> Rates:
    """Counts per kind in the last ``windows`` minutes, from (minute, kind, n) rows already
    summed over tokens.

    A window of ``w`` minutes is the current minute (so far) and the ``w - 1`` before it; it
    covers ``w - 1`` minutes plus the part of the current one gone by (at least a second, so a
    rate read on a minute's boundary stays finite).
    """
    now_minute, into = divmod(now_ms, MINUTE_MS)
    out = []
    for w in windows:
        counts = dict.fromkeys(RATE_KINDS, 0)
        for minute, kind, n in rows:
            if now_minute - w < minute <= now_minute:
                counts[kind] = counts.get(kind, 0) + n
        out.append(Rate(window_min=w, covered_min=w - 1 + max(into, 1_000) / MINUTE_MS,
                        counts=counts))
    return Rates(windows=out)


class Lag(msgspec.Struct, frozen=True, kw_only=True):
    consumer: str
    topic: str
    partition: int
    next_offset: int
    high_watermark: int | None
    lag: int | None
    updated_at_ms: int | None


class LagReport(msgspec.Struct, frozen=True, kw_only=True):
    rows: list[Lag]
    error: str | None  # the broker could not be asked: lag unknown


class Cores(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # a pool (instance collection) or a user
    n_ready: int
    ready_cores: float
    n_running: int
    running_cores: float
    n_creating: int


class InstanceCount(msgspec.Struct, frozen=True, kw_only=True):
    inst_coll: str
    state: str
    n: int
    cores: float
    free_cores: float


class BusyInstance(msgspec.Struct, frozen=True, kw_only=True):
    inst_coll: str
    name: str
    n_running: int  # attempts started and not ended
    running_cores: float
    since_ms: int | None  # start of its oldest running attempt


class Cancellation(msgspec.Struct, frozen=True, kw_only=True):
    batch_id: int
    job_group_id: int  # 0: the whole batch
    reason: str
    time_cancelled_ms: int
    user: str
    billing_project: str


class CallbackCount(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    n: int
    oldest_ms: int | None


class OwedCallback(msgspec.Struct, frozen=True, kw_only=True):
    idempotency_key: str
    batch_id: int
    job_group_id: int
    url: str
    status: str
    attempts: int
    next_attempt_ms: int | None
    last_error: str | None
    time_created_ms: int


class Callbacks(msgspec.Struct, frozen=True, kw_only=True):
    by_status: list[CallbackCount]
    owed: list[OwedCallback]  # pending or failed, oldest first
    unpublished_completions: int
    oldest_unpublished_ms: int | None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _mcpu(value: Any) -> float:
    return int(value or 0) / 1000


def lag_rows(offsets: Iterable[tuple[str, str, int, int, int | None]],
             marks: dict[tuple[str, int], int]) -> list[Lag]:
    """Lag of every consumer on every partition of the topics it reads.

    A partition the consumer has no row for yet has applied nothing: its whole length is lag.
    """
    stored = {(c, t, p): (n, u) for c, t, p, n, u in offsets}
    reads = {(c, t) for c, t, _ in stored}
    keys = set(stored) | {(c, t, p) for c, t in reads for (mt, p) in marks if mt == t}
    out = []
    for consumer, topic, partition in sorted(keys):
        next_offset, updated = stored.get((consumer, topic, partition), (0, None))
        hw = marks.get((topic, partition))
        out.append(Lag(consumer=consumer, topic=topic, partition=partition,
                       next_offset=next_offset, high_watermark=hw,
                       lag=None if hw is None else max(0, hw - next_offset),
                       updated_at_ms=updated))
    return out


class Ops:
    """System-wide operational reads over one store (and the log, for lag)."""

    def __init__(self, store: Store, log: LogSettings | None, *, marks_ttl_s: float = 3.0
                 ) -> None:
        self.store = store
        self.log = log
        self.marks_ttl_s = marks_ttl_s
        self._marks: tuple[float, dict[tuple[str, int], int]] = (-1e9, {})

    # --- synchronous reads (call them in a worker thread) ------------------------------------
    def rates(self, now_ms: int | None = None) -> Rates:
        """Events per minute by kind, from ``event_rates`` (minutes of the events' times)."""
        now = _now_ms() if now_ms is None else now_ms
        now_minute = now // MINUTE_MS
        rows = [(int(r.minute), str(r.kind), int(r.n)) for r in self.store.rows(
            _RATES, since=now_minute - max(WINDOWS_MIN) + 1, now=now_minute)]
        return rate_windows(rows, now)

    def offsets(self) -> list[tuple[str, str, int, int, int | None]]:
        """(consumer, topic, partition, next offset, updated at) of this deployment's
        consumers (those named with its topic prefix)."""
        prefix = self.log.topic_prefix if self.log is not None else ""
        return [(str(r.consumer), str(r.topic), int(r.kafka_partition), int(r.next_offset),
                 None if r.updated_at_ms is None else int(r.updated_at_ms))
                for r in self.store.rows(_OFFSETS) if str(r.consumer).startswith(prefix)]

    def cores_by(self, key: str) -> list[Cores]:
        """Ready and running cores per ``"pool"`` (instance collection) or ``"user"``."""
        column = {"pool": "inst_coll", "user": "user"}[key]
        return [Cores(name=str(r.name), n_ready=int(r.n_ready or 0),
                      ready_cores=_mcpu(r.ready_mcpu), n_running=int(r.n_running or 0),
                      running_cores=_mcpu(r.running_mcpu), n_creating=int(r.n_creating or 0))
                for r in self.store.rows(_CORES.format(key=column))]

    def instances(self) -> tuple[list[InstanceCount], int]:
        """Live instances by pool and state, and how many were deleted in all."""
        rows = [InstanceCount(inst_coll=str(r.inst_coll), state=str(r.state), n=int(r.n),
                              cores=_mcpu(r.cores_mcpu), free_cores=_mcpu(r.free_mcpu))
                for r in self.store.rows(_INSTANCES)]
        deleted = self.store.one(_DELETED)
        return rows, int(deleted[0]) if deleted else 0

    def busy_instances(self) -> list[BusyInstance]:
        """Instances running attempts now, by pool, from attempts that started and not ended."""
        return [BusyInstance(inst_coll=str(r.inst_coll), name=str(r.instance_name),
                             n_running=int(r.n), running_cores=_mcpu(r.cores_mcpu),
                             since_ms=None if r.since_ms is None else int(r.since_ms))
                for r in self.store.rows(_BUSY)]

    def cancellations(self, limit: int = 20) -> list[Cancellation]:
        """The latest cancelled batches and job groups (a cancelled group's descendants are
        not listed apart), newest first."""
        return [Cancellation(batch_id=int(r.batch_id), job_group_id=int(r.job_group_id),
                             reason=str(r.reason), time_cancelled_ms=int(r.time_cancelled_ms),
                             user=str(r.user), billing_project=str(r.billing_project))
                for r in self.store.rows(_CANCELLED.format(inner=_CANCELLED_INNER), n=limit)]

    def callbacks(self, limit: int = 20) -> Callbacks:
        by_status = [CallbackCount(status=str(r.status), n=int(r.n),
                                   oldest_ms=None if r.oldest_ms is None else int(r.oldest_ms))
                     for r in self.store.rows(_CALLBACKS)]
        owed = [OwedCallback(idempotency_key=str(r.idempotency_key), batch_id=int(r.batch_id),
                             job_group_id=int(r.job_group_id), url=str(r.url),
                             status=str(r.status), attempts=int(r.attempts),
                             next_attempt_ms=r.next_attempt_ms, last_error=r.last_error,
                             time_created_ms=int(r.time_created_ms))
                for r in self.store.rows(_CALLBACKS_OWED, n=limit)]
        outbox = self.store.one(_OUTBOX)
        return Callbacks(by_status=by_status, owed=owed,
                         unpublished_completions=int(outbox.n) if outbox else 0,
                         oldest_unpublished_ms=None if outbox is None or outbox.oldest_ms is None
                         else int(outbox.oldest_ms))

    # --- the broker ---------------------------------------------------------------------------
    async def _high_watermarks(self, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        at, cached = self._marks
        wanted = set(topics)
        if time.monotonic() - at < self.marks_ttl_s and wanted <= {t for t, _ in cached}:
            return cached
        assert self.log is not None
        marks = await high_watermarks(self.log, sorted(wanted), timeout_s=3.0)
        self._marks = (time.monotonic(), marks)
        return marks

    async def lag(self) -> LagReport:
        """Consumer lag per partition; without a reachable broker, the stored offsets alone."""
        offsets = await asyncio.to_thread(self.offsets)
        topics = sorted({t for _, t, _, _, _ in offsets})
        if self.log is None:
            return LagReport(rows=lag_rows(offsets, {}), error="no broker configured")
        try:
            marks = await self._high_watermarks(topics) if topics else {}
        except (KafkaError, LogError, OSError, TimeoutError) as e:
            return LagReport(rows=lag_rows(offsets, {}), error=f"broker query failed: {e!r}")
        return LagReport(rows=lag_rows(offsets, marks), error=None)
