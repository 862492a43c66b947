"""Hail-style HTTP callbacks: the completions topic in, POSTs with retries out.

:class:`CallbackIntake` reads the completions topic like any downstream consumer. Each
completion whose batch (or job group) has a callback URL becomes a pending row of
``callback_deliveries``, keyed by the completion's idempotency key and inserted in the same
transaction as the consumer's offsets (so a record is turned into a delivery exactly once in
effect, and a completion published twice is still one delivery). The body is the status
document as of the completion, built once, so every attempt sends the same bytes.

:class:`CallbackSender` claims due deliveries, POSTs them (``Idempotency-Key`` header), and
records the outcome: delivered on a 2xx; otherwise pending again after a capped, jittered
exponential backoff, or failed once the attempts are used up. State lives in the database only,
so a restarted service resumes where the last one stopped: at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

import aiohttp
import sqlalchemy as sa

from core.completions import (
    AfterAttempt,
    Completion,
    after_attempt,
    completion_of,
    sender_wait_s,
)
from schemas.batch import BatchCompleted, JobGroupCompleted
from schemas.codec import DecodeError
from services.common.log import LogConsumer, LogError, Record, now_ms
from services.common.offsets import MySQLOffsetStore
from services.completions import metrics as completions_metrics
from services.completions.settings import CompletionsSettings
from services.completions.store import CompletionsStore, Delivery, NewDelivery

log = logging.getLogger(__name__)

USER_AGENT = "hailstream-completions/1"
HEADER_KEY = "Idempotency-Key"
HEADER_EVENT = "X-Hailstream-Event"
HEADER_ATTEMPT = "X-Hailstream-Attempt"


def _completions(records: list[Record]) -> list[Completion]:
    return [completion_of(r.envelope.event) for r in records
            if isinstance(r.envelope.event, BatchCompleted | JobGroupCompleted)]


class CallbackIntake:
    """Turns completions on the topic into pending deliveries (see the module docstring)."""

    def __init__(self, settings: CompletionsSettings, store: CompletionsStore,
                 consumer: LogConsumer, consumer_name: str, *,
                 wake: asyncio.Event | None = None, clock: Callable[[], int] = now_ms) -> None:
        self._settings = settings
        self._store = store
        self._consumer = consumer
        self._name = consumer_name
        self._offsets = MySQLOffsetStore(store.engine)
        self._wake = wake
        self._clock = clock

    async def take(self, records: list[Record]) -> int:
        """Apply one batch of records; how many deliveries it added."""
        plans: dict[str, NewDelivery] = {}
        for c in _completions(records):
            found = await asyncio.to_thread(self._store.new_delivery, c)
            if found is not None:
                plans[c.key] = found

        def effect(conn: sa.Connection, fresh: list[Record]) -> int:
            owed = {c.key: plans[c.key] for c in _completions(fresh) if c.key in plans}
            CompletionsStore.add_deliveries(conn, list(owed.values()), self._clock())
            return len(owed)

        _, added = await asyncio.to_thread(self._offsets.apply, self._name, records, effect)
        if added:
            log.info("%d callback(s) to deliver", added)
            if self._wake is not None:
                self._wake.set()
        return added or 0

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``; wait out an unreachable database (the batch is re-applied)."""
        delay = self._settings.poll_s
        pending: list[Record] = []
        while not stop.is_set():
            try:
                if not pending:
                    pending = await self._consumer.next_batch()
                if pending:
                    await self.take(pending)
                    pending = []
                delay = self._settings.poll_s
            except (LogError, sa.exc.OperationalError) as e:
                if isinstance(e, LogError) and not e.retryable:
                    raise
                delay = min(max(delay * 2, 0.5), self._settings.retry_max_s)
                log.warning("callback intake: %s; retrying in %.1fs", e, delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
            except DecodeError:
                log.exception("callback intake: undecodable record; stopping")
                raise


class CallbackSender:
    """POSTs due deliveries and records what happened (see the module docstring)."""

    def __init__(self, settings: CompletionsSettings, store: CompletionsStore,
                 session: aiohttp.ClientSession, *, wake: asyncio.Event | None = None,
                 clock: Callable[[], int] = now_ms,
                 rng: random.Random | None = None) -> None:
        self._settings = settings
        self._store = store
        self._session = session
        self._wake = wake or asyncio.Event()
        self._clock = clock
        self._rng = rng or random.Random()

    async def post(self, d: Delivery) -> str | None:
        """One attempt; None when the receiver answered 2xx, else what went wrong."""
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   HEADER_KEY: d.key, HEADER_ATTEMPT: str(d.attempt),
                   HEADER_EVENT: "batch.completed" if d.job_group_id == 0
                   else "job_group.completed"}
        timeout = aiohttp.ClientTimeout(total=self._settings.http_timeout_s)
        try:
            async with self._session.post(
                    d.url, data=d.payload.encode(), headers=headers, timeout=timeout,
                    allow_redirects=False) as resp:
                if 200 <= resp.status < 300:
                    return None
                body = await resp.text(errors="replace")
                return f"HTTP {resp.status}: {body[:500]}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: a bad URL
            return f"{type(e).__name__}: {e}"

    async def attempt(self, d: Delivery) -> AfterAttempt:
        """POST a claimed delivery once and record the outcome."""
        s = self._settings
        error = await self.post(d)
        now = self._clock()
        after = after_attempt(ok=error is None, attempts=d.attempt, max_attempts=s.max_attempts,
                              now_ms=now, base_ms=int(s.backoff_base_s * 1000),
                              cap_ms=int(s.backoff_max_s * 1000), jitter=self._rng.random())
        completions_metrics.attempted(after.status)
        if after.status == "failed":
            log.warning("callback %s to %s failed for good after %d attempts: %s", d.key, d.url,
                        d.attempt, error)
        elif error is not None:
            log.info("callback %s attempt %d failed (%s); next in %d ms", d.key, d.attempt,
                     error, (after.next_attempt_ms or now) - now)
        try:
            await asyncio.to_thread(self._store.record, [(d, after, error)], now)
        except sa.exc.OperationalError as e:  # the claim expires and the attempt is repeated
            log.warning("callback %s: could not record attempt %d: %s", d.key, d.attempt, e)
        return after

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``, up to ``concurrency`` POSTs in flight.

        A slow receiver holds one slot, not the others: a slot is refilled as soon as its POST
        ends. Due deliveries are claimed when a slot frees, the intake wakes the loop, or the
        earliest pending delivery is due (a retry, an expired claim), and at least every
        ``idle_s``. Stopping abandons the POSTs in flight; their claims expire and they are
        attempted again.
        """
        s = self._settings
        inflight: set[asyncio.Task[AfterAttempt]] = set()
        failures: list[BaseException] = []

        def finished(task: asyncio.Task[AfterAttempt]) -> None:
            inflight.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())  # type: ignore[arg-type]

        retry = 0.0  # after a database error, how long to wait before trying again
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                self._wake.clear()
                free = s.concurrency - len(inflight)
                due: list[Delivery] = []
                delay = s.idle_s  # every slot taken: the first attempt to end wakes the loop
                if free > 0:
                    try:
                        claimed = await asyncio.to_thread(self._store.claim_due, self._clock(),
                                                          free, s.claim_ms)
                        due = claimed.deliveries
                        delay = sender_wait_s(claimed.next_due_ms, self._clock(),
                                              idle_s=s.idle_s)
                        retry = 0.0
                    except sa.exc.OperationalError as e:
                        delay = retry = min(max(retry * 2, 0.5), s.retry_max_s)
                        log.warning("callback sender: %s; retrying in %.1fs", e, delay)
                for d in due:
                    task = asyncio.create_task(self.attempt(d), name=f"callback-{d.key}")
                    inflight.add(task)
                    task.add_done_callback(finished)
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({stopping, woken, *inflight}, timeout=delay,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                await asyncio.sleep(0)  # let finished attempts report
                if failures:
                    raise failures[0]  # an unexpected error in an attempt stops the service
        finally:
            stopping.cancel()
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
