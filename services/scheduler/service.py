"""A scheduler replica: folds the log into memory, contends for the lease, and leads when it wins.

Every replica is a hot standby: it reads ``batch-events`` and ``scheduler-events`` from the
beginning and keeps folding them into a :class:`~core.scheduler_state.SchedulerState` (no MySQL:
invariant 6). The replica that takes the lease (:mod:`lease`) is elected:

1. it folds up to the end of the log, so it knows the latest epoch;
2. it publishes ``scheduler.elected`` with the next epoch, and from then on stamps that epoch on
   every envelope it publishes, so SJs of an older leader are ignored by every fold (fencing);
3. it folds up to the end of the log again (its own election included) and starts leading
   (:class:`~services.scheduler.leader.Leader`): attempts the old leader scheduled but no worker
   started are delivered again, idempotently by attempt.

A leader steps down, and :meth:`Scheduler.run` returns, when its lease connection breaks or a
newer epoch appears on the log. Instances outlive the replica that created them (they are VMs):
the next leader keeps using them, by the addresses their workers announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Self

from schemas import topics
from schemas.infra import SchedulerElected
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    Publisher,
    high_watermarks,
)
from services.common.settings import Settings
from services.scheduler.budget import Budgets
from services.scheduler.drivers import ComputeDriver
from services.scheduler.leader import Leader
from services.scheduler.lease import Lease
from services.scheduler.settings import SchedulerSettings
from services.scheduler.view import View

log = logging.getLogger(__name__)

FOLDED_TOPICS = (topics.BATCH, topics.SCHEDULER, topics.CONTROL)


class Scheduler:
    """One replica (see the module docstring); an async context manager."""

    def __init__(self, settings: Settings, sched: SchedulerSettings,
                 driver: ComputeDriver) -> None:
        self._settings = settings
        self._sched = sched
        self._driver = driver
        self.view = View()
        self._consumer = LogConsumer(settings.log, ConsumerOptions(
            name=f"scheduler-{sched.scheduler_id}", topics=FOLDED_TOPICS, group=False,
            max_records=5_000, fetch_timeout_ms=100, heads=True))  # it reads no spec
        self._lease = Lease(settings.db, sched.lease)
        self._folding: asyncio.Task[None] | None = None
        self.epoch: int | None = None
        """The epoch this replica leads with, once elected."""
        self.leader: Leader | None = None

    async def __aenter__(self) -> Self:
        await self._consumer.start()
        self._folding = asyncio.create_task(self._fold_forever(), name="scheduler-fold")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._folding is not None:
            self._folding.cancel()
            await asyncio.gather(self._folding, return_exceptions=True)
        await self._consumer.stop()
        await self._lease.release()

    async def _fold_forever(self) -> None:
        async for records in self._consumer.batches():
            self.view.fold(records)

    async def caught_up(self, timeout_s: float = 60.0) -> None:
        """Wait until everything on the log now has been folded."""
        marks = await high_watermarks(self._settings.log, FOLDED_TOPICS)
        async with asyncio.timeout(timeout_s):
            while not self.view.reached(marks):
                if self._folding is not None and self._folding.done():
                    self._folding.result()  # the fold died: say why
                self.view.changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await self.view.changed.wait()

    async def run(self, stop: asyncio.Event) -> str:
        """Stand by until elected, then lead until ``stop`` or deposition; returns why it ended."""
        while not stop.is_set():
            if await self._lease.try_acquire():
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sched.lease_check_s):
                    await stop.wait()
        else:
            return "stopped"
        await self.caught_up()
        epoch = self.view.state.epoch + 1
        async with Publisher(self._settings.log, producer_epoch=epoch) as publisher:
            await publisher.publish(SchedulerElected(epoch=epoch,
                                                     scheduler_id=self._sched.scheduler_id))
            await self.caught_up()
            self.epoch = epoch
            log.info("scheduler %s elected with epoch %d", self._sched.scheduler_id, epoch)
            async with Budgets(self._settings.db) as budgets:
                self.leader = Leader(self.view, self._sched, self._driver, publisher,
                                     budgets=budgets)
                async with self.leader:
                    return await self._lead(stop, epoch)

    async def _lead(self, stop: asyncio.Event, epoch: int) -> str:
        assert self.leader is not None
        rounds = asyncio.create_task(self.leader.run(), name="scheduler-rounds")
        stopping = asyncio.create_task(stop.wait(), name="scheduler-stop")
        try:
            while True:
                await asyncio.wait({rounds, stopping}, timeout=self._sched.lease_check_s,
                                   return_when=asyncio.FIRST_COMPLETED)
                if rounds.done():
                    rounds.result()  # a crashed loop must not pass for a healthy leader
                if stopping.done():
                    return "stopped"
                if self.view.state.epoch > epoch:
                    log.warning("a newer scheduler (epoch %d) was elected: stepping down",
                                self.view.state.epoch)
                    return "deposed"
                if not await self._lease.held():
                    log.warning("lost the scheduler lease: stepping down")
                    return "deposed"
        finally:
            for task in (rounds, stopping):
                task.cancel()
            await asyncio.gather(rounds, stopping, return_exceptions=True)
