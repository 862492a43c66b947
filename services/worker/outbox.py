"""The worker's outbox: what it reports, published together, MJCs of one batch as one record.

A worker that finishes hundreds of short jobs a second would otherwise publish one MJC record per
job, and every consumer (the broker, the projector, the scheduler) pays a per-record cost on each
besides the work of the completion itself. The outbox gathers what is reported during
``linger_s``, turns the MJCs of each batch into one :class:`JobsCompleted` (a batch with a single
MJC keeps its :class:`JobCompleted`) and publishes the lot in one call. Whatever is reported while
that call is on its way goes out in the next one.

:meth:`Outbox.put` returns once the log took the event: retryable :class:`LogError` are retried
with backoff (a duplicate on the log is harmless: consumers are idempotent by attempt), a fatal
one is logged and the event dropped, as a single publish would. The linger replaces the
producer's own (the worker's publisher sends at once), so a completion waits no longer than it
did when each was its own record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from schemas.events import AnyEvent
from schemas.execution import JobCompleted, JobsCompleted
from services.common.eventloop import cancel_and_wait
from services.common.log import LogError, Publisher

log = logging.getLogger(__name__)

MAX_BUNCH: Final = 200
"""The most MJCs one :class:`JobsCompleted` carries (status documents are a few hundred bytes
each: well under a broker's usual 1 MB record limit)."""


def bunch_completions(events: Sequence[AnyEvent], max_attempts: int = MAX_BUNCH
                      ) -> list[AnyEvent]:
    """``events`` with the MJCs of each (batch, instance) as bunches of at most
    ``max_attempts``, each where its first MJC was; a lone MJC stays as it is.

    Every other event keeps its place, and each batch's MJCs keep their order, so the result says
    what ``events`` say: a consumer that expands the bunches folds the same completions.
    """
    groups: dict[tuple[int, str], list[JobCompleted]] = {}
    slots: list[AnyEvent | list[JobCompleted]] = []
    for e in events:
        if not isinstance(e, JobCompleted):
            slots.append(e)
            continue
        group = groups.get((e.batch_id, e.instance_name))
        if group is None or len(group) == max_attempts:
            group = groups[(e.batch_id, e.instance_name)] = []
            slots.append(group)
        group.append(e)
    return [s if not isinstance(s, list) else s[0] if len(s) == 1 else JobsCompleted.of(s)
            for s in slots]


class Outbox:
    """Publishes what is put, every ``linger_s``, until the log takes it (see the module
    docstring). ``close`` stops it; events still waiting then are not published."""

    def __init__(self, publisher: Publisher, *, linger_s: float, retry_s: float,
                 max_retry_s: float) -> None:
        self._publisher = publisher
        self._linger_s = linger_s
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._pending: list[tuple[AnyEvent, asyncio.Future[None]]] = []
        self._inflight: list[tuple[AnyEvent, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def put(self, event: AnyEvent) -> None:
        """Return once ``event`` is on the log (or could never be: a fatal error, logged).

        Cancelling the caller does not take the event back: it still goes out.
        """
        if self._closed:
            raise RuntimeError("the outbox is closed")
        done = asyncio.get_running_loop().create_future()
        self._pending.append((event, done))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name="outbox")
        # Not shielded: the event is in the list, and a cancelled ``done`` (its only waiter
        # cancelled) leaves it there. A shield per event was two more futures per job.
        await done

    async def _drain(self) -> None:
        try:
            while self._pending:
                if self._linger_s > 0:
                    await asyncio.sleep(self._linger_s)
                self._inflight, self._pending = self._pending, []
                try:
                    await self._publish([e for e, _ in self._inflight])
                except Exception:  # not the log's (one bad event?): the others one by one
                    log.exception("publishing %d events failed; trying each alone",
                                  len(self._inflight))
                    await self._publish_each(self._inflight)
                for _, done in self._inflight:
                    if not done.done():
                        done.set_result(None)
                self._inflight = []
        finally:
            self._task = None

    async def _publish_each(self, items: list[tuple[AnyEvent, asyncio.Future[None]]]) -> None:
        """Publish events alone, so that one that cannot be published fails only its waiter."""
        for event, done in items:
            try:
                await self._publish([event])
            except Exception as e:
                log.exception("cannot publish %s", type(event).__name__)
                if not done.done():
                    done.set_exception(e)

    async def _publish(self, events: list[AnyEvent]) -> None:
        records = bunch_completions(events)
        delay = self._retry_s
        while True:
            try:
                await self._publisher.publish_many(records)
                return
            except LogError as e:
                what = ", ".join(sorted({type(r).__name__ for r in records}))
                if not e.retryable:
                    log.error("cannot publish %d events (%s), giving up: %s", len(events),
                              what, e)
                    return
                log.warning("publishing %d events (%s) failed, retrying in %.1fs: %s",
                            len(events), what, delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_s)

    async def close(self) -> None:
        """Stop publishing; whoever still waits in :meth:`put` is cancelled."""
        self._closed = True
        task = self._task
        if task is not None:
            await cancel_and_wait(task)
        for _, done in (*self._inflight, *self._pending):
            done.cancel()
        self._inflight, self._pending = [], []
