"""The projector's metrics: events applied by type, transactions, and consumer lag.

Applied counts come from the sink's result, once per transaction (a few label lookups per
batch, never one per record). Lag is the high watermark of each partition minus the next
offset the projector will apply (stored in ``applied_offsets``), refreshed every
:data:`LAG_INTERVAL_S` by the metrics server, for the partitions this instance is assigned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from services.common.log import high_watermarks
from services.common.metrics import counter, gauge, histogram
from services.common.offsets import MySQLOffsetStore
from services.common.settings import LogSettings
from services.projector.sink import Applied

EVENTS_APPLIED = counter("hs_projector_events_applied",
                         "Records applied to the projection (first time only), by event tag.",
                         ["type"])
TRANSACTIONS = counter("hs_projector_transactions",
                       "Projection transactions committed with at least one fresh record.")
RECORDS_PER_TRANSACTION = histogram(
    "hs_projector_records_per_transaction", "Fresh records applied per transaction.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000))
TRANSACTION_SECONDS = histogram("hs_projector_transaction_seconds",
                                "Time to apply one batch of records (one transaction).")
LAG = gauge("hs_projector_lag",
            "Records on the log not yet applied: high watermark - next offset to apply.",
            ["topic", "partition"])
LAG_REFRESH = gauge("hs_projector_lag_refreshed_timestamp_seconds",
                    "When the lag was last computed (Unix time).")

LAG_INTERVAL_S = 5.0

_by_type: dict[str, Counter] = {}


def observe(applied: Applied, seconds: float) -> None:
    """Count one call of :meth:`Sink.apply` that took ``seconds``."""
    if not applied.fresh:
        return
    TRANSACTIONS.inc()
    RECORDS_PER_TRANSACTION.observe(applied.fresh)
    TRANSACTION_SECONDS.observe(seconds)
    for tag, n in applied.by_tag.items():
        child = _by_type.get(tag)
        if child is None:
            child = _by_type[tag] = EVENTS_APPLIED.labels(tag)
        child.inc(n)


class LagProbe:
    """Computes the lag of one consumer's partitions and sets :data:`LAG`.

    ``assigned`` returns the (logical topic, partition) pairs this instance reads, or None when
    every partition of ``topics`` counts (a single instance, or a test).
    """

    def __init__(self, log: LogSettings, offsets: MySQLOffsetStore, consumer: str,
                 topics: Sequence[str],
                 assigned: Callable[[], set[tuple[str, int]] | None] | None = None) -> None:
        self._log = log
        self._offsets = offsets
        self._consumer = consumer
        self._topics = list(topics)
        self._assigned = assigned or (lambda: None)
        self._reported: set[tuple[str, int]] = set()

    async def refresh(self) -> dict[tuple[str, int], int]:
        """Compute and publish the lag; returns it."""
        # Watermarks first: offsets read afterwards can only be further on, so a consumer that
        # has caught up reads 0, never a stale positive lag.
        marks = await high_watermarks(self._log, self._topics)
        stored = await asyncio.to_thread(self._offsets.load, self._consumer, self._topics)
        mine = self._assigned()
        lag = {tp: max(0, hw - stored.get(tp, 0)) for tp, hw in marks.items()
               if mine is None or tp in mine}
        for topic, partition in self._reported - set(lag):
            LAG.remove(topic, str(partition))  # revoked: another instance reports it
        for (topic, partition), n in lag.items():
            LAG.labels(topic, str(partition)).set(n)
        self._reported = set(lag)
        LAG_REFRESH.set_to_current_time()
        return lag
