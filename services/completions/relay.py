"""The outbox relay: completions the projector wrote become events on the completions topic.

Each round reads the unpublished outbox rows, publishes them (``acks=all``, keyed by batch id)
and only then marks them published. A crash in between publishes them again on restart: at
least once. Every publication of one completion carries the same event id
(:func:`core.completions.event_id`), so a consumer can drop the repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import sqlalchemy as sa

from core.completions import event_id, event_of
from schemas.envelope import wrap
from services.common.log import LogError, Publisher, now_ms
from services.completions import metrics as completions_metrics
from services.completions.settings import CompletionsSettings
from services.completions.store import CompletionsStore

log = logging.getLogger(__name__)


class OutboxRelay:
    """Publishes the outbox: one round (:meth:`publish_pending`) or until stopped (:meth:`run`)."""

    def __init__(self, settings: CompletionsSettings, store: CompletionsStore,
                 publisher: Publisher, *, clock: Callable[[], int] = now_ms) -> None:
        self._settings = settings
        self._store = store
        self._publisher = publisher
        self._clock = clock
        self.published = 0

    async def publish_pending(self) -> int:
        """Publish one round of unpublished completions; how many it published."""
        pending = await asyncio.to_thread(self._store.unpublished, self._settings.batch_size)
        if not pending:
            return 0
        now = self._clock()
        await self._publisher.publish_many([
            wrap(event_of(c), event_id=event_id(c), time_ms=now) for c in pending])
        await asyncio.to_thread(self._store.mark_published, pending, self._clock())
        self.published += len(pending)
        completions_metrics.RELAYED.inc(len(pending))
        log.info("published %d completion(s), up to batch %d", len(pending), pending[-1].batch_id)
        return len(pending)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop``; wait out an unreachable broker or database."""
        delay = self._settings.poll_s
        while not stop.is_set():
            try:
                full = await self.publish_pending() >= self._settings.batch_size
                delay = self._settings.poll_s
            except (LogError, sa.exc.OperationalError) as e:
                if isinstance(e, LogError) and not e.retryable:
                    raise
                delay = min(max(delay * 2, 0.5), self._settings.retry_max_s)
                log.warning("outbox relay: %s; retrying in %.1fs", e, delay)
                full = False
            if not full:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
