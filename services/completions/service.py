"""The completions service: the outbox relay, the callback intake and the callback sender.

Three loops share one database engine: the relay publishes the projector's outbox to the
completions topic; the intake reads that topic back (a consumer like any other, its offsets in
``applied_offsets``) and owes a callback for each completion with a URL; the sender delivers
them. Running several instances is safe (each loop is idempotent or claims its work), only
wasteful. An async context manager; stopping is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Self

import aiohttp
import msgspec
import sqlalchemy as sa

from schemas import topics
from services.common.log import ConsumerOptions, LogConsumer, Publisher
from services.common.settings import Settings
from services.completions.callbacks import CallbackIntake, CallbackSender
from services.completions.relay import OutboxRelay
from services.completions.settings import CompletionsSettings, callback_consumer
from services.completions.store import CompletionsStore

log = logging.getLogger(__name__)


class CompletionsService:
    """See the module docstring."""

    def __init__(self, settings: Settings, completions: CompletionsSettings) -> None:
        self._settings = settings
        self._cs = completions
        self._engine: sa.Engine | None = None
        self._publisher: Publisher | None = None
        self._consumer: LogConsumer | None = None
        self._session: aiohttp.ClientSession | None = None
        self.store: CompletionsStore | None = None
        self.relay: OutboxRelay | None = None
        self.intake: CallbackIntake | None = None
        self.sender: CallbackSender | None = None

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        s, cs = self._settings, self._cs
        self._engine = sa.create_engine(s.db.url(), pool_size=4, pool_pre_ping=True)
        self.store = CompletionsStore(self._engine)
        self._publisher = Publisher(s.log)
        await self._publisher.start()
        self.relay = OutboxRelay(cs, self.store, self._publisher)
        if cs.callbacks:
            wake = asyncio.Event()
            name = callback_consumer(s.log)
            intake_log = msgspec.structs.replace(s.log, fetch_max_wait_ms=max(
                s.log.fetch_max_wait_ms, cs.intake_fetch_wait_ms))
            self._consumer = LogConsumer(intake_log, ConsumerOptions(
                name=name, topics=[topics.COMPLETIONS], group=False, max_records=500))
            await self._consumer.start()
            self._session = aiohttp.ClientSession()
            self.intake = CallbackIntake(cs, self.store, self._consumer, name, wake=wake)
            self.sender = CallbackSender(cs, self.store, self._session, wake=wake)

    async def stop(self) -> None:
        """Close everything this service opened. Idempotent."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            await publisher.stop()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose()

    async def run(self, stop: asyncio.Event) -> None:
        """Run the loops until ``stop``; if one fails, stop the others and raise its error."""
        assert self.relay is not None, "start the service first"
        loops = [self.relay.run(stop)]
        if self.intake is not None and self.sender is not None:
            loops += [self.intake.run(stop), self.sender.run(stop)]
        tasks = [asyncio.create_task(c) for c in loops]
        log.info("completions service running (callbacks %s)",
                 "on" if self.sender is not None else "off")
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()  # raises the first failure
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
