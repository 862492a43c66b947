"""The completions service's metrics: outbox rows relayed, callbacks delivered, retried and
failed, and how much work is waiting (refreshed every :data:`PENDING_INTERVAL_S`)."""

from __future__ import annotations

import asyncio

from services.common.metrics import counter, gauge
from services.completions.store import CompletionsStore

RELAYED = counter("hs_completions_outbox_relayed",
                  "Outbox rows published to the completions topic.")
CALLBACKS_DELIVERED = counter("hs_completions_callbacks_delivered",
                              "Callbacks delivered (the receiver answered 2xx).")
CALLBACKS_RETRIED = counter("hs_completions_callbacks_retried",
                            "Callback attempts that failed and will be tried again.")
CALLBACKS_FAILED = counter("hs_completions_callbacks_failed",
                           "Callbacks given up on after their last attempt.")
CALLBACKS_PENDING = gauge("hs_completions_callbacks_pending",
                          "Callbacks waiting for a (next) attempt.")
OUTBOX_UNPUBLISHED = gauge("hs_completions_outbox_unpublished",
                           "Completions in the outbox not yet on the completions topic.")

PENDING_INTERVAL_S = 5.0

_OUTCOMES = {"delivered": CALLBACKS_DELIVERED, "pending": CALLBACKS_RETRIED,
             "failed": CALLBACKS_FAILED}


def attempted(status: str) -> None:
    """A callback attempt left its delivery ``status`` (delivered, pending or failed)."""
    _OUTCOMES[status].inc()


class PendingProbe:
    """Refreshes the waiting-work gauges from the database."""

    def __init__(self, store: CompletionsStore) -> None:
        self._store = store

    async def refresh(self) -> tuple[int, int]:
        """(unpublished outbox rows, pending callbacks), also set on the gauges."""
        unpublished, pending = await asyncio.to_thread(self._store.backlog)
        OUTBOX_UNPUBLISHED.set(unpublished)
        CALLBACKS_PENDING.set(pending)
        return unpublished, pending
