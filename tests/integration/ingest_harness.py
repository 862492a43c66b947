"""Ingest's commands on a real broker and a migrated database, the projector played by its sink.

Set-up events are applied through the sink to partitions the broker does not have; what the
commands append goes to the real log, and a test says when the projector "applied" it (by
applying events itself and moving ``applied_offsets`` to the log's end).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import AsyncIterator

import sqlalchemy as sa

from core.resources import default_config
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from schemas.topics import BATCH
from services.common.log import Publisher, bootstrap_topics, high_watermarks
from services.common.settings import DatabaseSettings, LogSettings
from services.ingest.commands import Commands
from services.ingest.store import Store, User
from services.projector.sink import Sink

from .projection_helpers import Stream

_PARTITIONS = itertools.count(100)
ALICE = User("alice", is_developer=False)
WAIT_S = 0.5


class Harness:
    def __init__(self, engine: sa.Engine, publisher: Publisher, settings: LogSettings,
                 consumer: str) -> None:
        self.engine, self.publisher, self.settings = engine, publisher, settings
        self.consumer = consumer
        self.sink = Sink(engine, consumer)
        # Set-up records go to partitions the broker does not have (their stored offsets say
        # nothing about the real log), new ones per test (the database is the module's).
        self.setup = Stream(BATCH, partition=next(_PARTITIONS))
        self.control = Stream("control-events", partition=next(_PARTITIONS))
        self.commands = Commands(Store(engine, consumer), publisher, default_config(),
                                 wait_s=WAIT_S)

    def project(self, *events: object) -> None:
        self.sink.apply(self.setup.records(list(events)))  # type: ignore[arg-type]

    async def log_ends(self) -> int:
        """How many records the batch topic holds in all."""
        return sum((await high_watermarks(self.settings, [BATCH])).values())

    async def projector_at_end(self) -> None:
        """The projector has applied everything on the real log."""
        ends = await high_watermarks(self.settings, [BATCH])
        with self.engine.begin() as conn:
            for (topic, partition), end in ends.items():
                conn.execute(sa.text(
                    "INSERT INTO applied_offsets (consumer, topic, kafka_partition, "
                    "next_offset, updated_at_ms) VALUES (:c, :t, :p, :n, 0) "
                    "ON DUPLICATE KEY UPDATE next_offset = :n"),
                    {"c": self.consumer, "t": topic, "p": partition, "n": end})


@contextlib.asynccontextmanager
async def open_harness(db: DatabaseSettings, log: LogSettings, consumer: str
                       ) -> AsyncIterator[Harness]:
    await bootstrap_topics(log)
    engine = sa.create_engine(db.url())
    try:
        async with Publisher(log) as publisher:
            h = Harness(engine, publisher, log, consumer)
            h.sink.apply(h.control.records([
                UserCreated(user="alice"),
                TokenIssued(user="alice", token_id="t1",
                            token_sha256=hashlib.sha256(b"x").hexdigest()),
                BillingProjectCreated(billing_project="proj"),
                BillingProjectMemberAdded(billing_project="proj", user="alice")]))
            yield h
    finally:
        engine.dispose()
