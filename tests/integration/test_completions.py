"""The completions service on the real broker and MariaDB, calling back a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import sqlalchemy as sa
from aiohttp import web

from core.completions import Completion, event_id, event_of, idempotency_key
from schemas.batch import BatchCompleted, BatchCreated, JobGroupCompleted, JobGroupRecord
from schemas.control import BillingProjectCreated, BillingProjectMemberAdded, UserCreated
from schemas.envelope import wrap
from schemas.execution import JobCompleted, JobScheduled
from services.common import procs
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    Publisher,
    Record,
    bootstrap_topics,
)
from services.common.settings import TOPIC_COMPLETIONS, DatabaseSettings, LogSettings, Settings
from services.completions.callbacks import CallbackSender
from services.completions.relay import OutboxRelay
from services.completions.service import CompletionsService
from services.completions.settings import CompletionsSettings
from services.completions.store import Claimed, CompletionsStore, NewDelivery
from services.ingest.reads import Reads
from services.ingest.store import Store
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, job, submission

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

# The sender's idle_s is longer than any test waits: a retry or an expired claim is attempted
# only because the sender sleeps until it is due.
FAST = CompletionsSettings(poll_s=0.05, backoff_base_s=0.05, backoff_max_s=0.2,
                           http_timeout_s=2.0, max_attempts=5, idle_s=120.0)


class Receiver:
    """A callback endpoint: records every request and answers with ``statuses`` in turn."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.statuses: list[int] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.json()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="ok" if status < 300 else "try again")

    def for_key(self, key: str) -> list[tuple[dict[str, str], Any]]:
        return [r for r in self.requests if r[0].get("Idempotency-Key") == key]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/{name}", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = procs.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    r.url = f"http://127.0.0.1:{port}"
    try:
        yield r
    finally:
        await runner.cleanup()


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


@pytest.fixture
async def settings(log_settings: LogSettings, migrated_db: DatabaseSettings) -> Settings:
    await bootstrap_topics(log_settings)
    return Settings(log=log_settings, db=migrated_db)


class Project:
    """Folds events into the projections (as the projector does) for one test."""

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self.sink = Sink(engine, name)
        self.stream = Stream()
        self.sink.apply(self.stream.records([
            UserCreated(user="alice"), BillingProjectCreated(billing_project="proj"),
            BillingProjectMemberAdded(billing_project="proj", user="alice")]))

    def __call__(self, events: list[Any]) -> None:
        self.sink.apply(self.stream.records(events))


@pytest.fixture
def project(engine: sa.Engine, request: pytest.FixtureRequest) -> Project:
    return Project(engine, request.node.name)


def ran(b: int, j: int, state: str = "Success") -> list[Any]:
    return [JobScheduled(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name="w1",
                         inst_coll="standard", cores_mcpu=1000),
            JobCompleted(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name="w1",
                         state=state, exit_code=0 if state == "Success" else 1,  # type: ignore[arg-type]
                         start_time_ms=T0, end_time_ms=T0 + 1)]


def batch_with_callbacks(b: int, url: str | None, group_url: str | None = None) -> list[Any]:
    """A batch whose job 1 is in group 1 (with ``group_url``) and job 2 in the root, both run."""
    created = BatchCreated(batch_id=b, user="alice", billing_project="proj", token=f"t{b}",
                           callback=url)
    return [created, *submission(b, 1, [job(1, 1), job(2)],
                                 [JobGroupRecord(job_group_id=1, parent_id=0,
                                                 callback=group_url)]),
            *ran(b, 1), *ran(b, 2, "Failed")]


@contextlib.asynccontextmanager
async def service(settings: Settings, cs: CompletionsSettings = FAST
                  ) -> AsyncIterator[CompletionsService]:
    stop = asyncio.Event()
    async with CompletionsService(settings, cs) as svc:
        task = asyncio.create_task(svc.run(stop))
        try:
            yield svc
        finally:
            stop.set()
            await task


async def eventually(what: str, check: Callable[[], Awaitable[Any]] | Callable[[], Any],
                     within_s: float = 30.0) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def completions_on_topic(log: LogSettings, n: int) -> list[Record]:
    """The first ``n`` records of the completions topic (all partitions)."""
    options = ConsumerOptions(name="reader", topics=[TOPIC_COMPLETIONS], group=False)
    out: list[Record] = []
    async with LogConsumer(log, options) as consumer:
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            out += await consumer.next_batch()
        await asyncio.sleep(0.3)  # and nothing more
        out += await consumer.next_batch()
    return out


def delivery(engine: sa.Engine, key: str) -> Any:
    return CompletionsStore(engine).delivery(key)


def status_of(engine: sa.Engine, key: str) -> str | None:
    row = delivery(engine, key)
    return None if row is None else str(row.status)


async def test_an_outbox_row_becomes_exactly_its_event_on_the_topic(
        settings: Settings, engine: sa.Engine, project: Project) -> None:
    project(batch_with_callbacks(101, None))
    store = CompletionsStore(engine)
    pending = store.unpublished(100)
    batch = Completion(101, 0, 2, "failure", 1, 1, 0, pending[-1].time_completed_ms)
    group = Completion(101, 1, 1, "success", 1, 0, 0, pending[0].time_completed_ms)
    assert pending == [group, batch]
    async with Publisher(settings.log) as pub:
        relay = OutboxRelay(FAST, store, pub)
        assert await relay.publish_pending() == 2
        assert await relay.publish_pending() == 0  # published once
    records = await completions_on_topic(settings.log, 2)
    assert [r.envelope.event for r in records] == [
        JobGroupCompleted(batch_id=101, job_group_id=1, outcome="success", n_jobs=1,
                          n_succeeded=1, n_failed=0, n_cancelled=0,
                          time_completed_ms=group.time_completed_ms),
        BatchCompleted(batch_id=101, outcome="failure", n_jobs=2, n_succeeded=1, n_failed=1,
                       n_cancelled=0, time_completed_ms=batch.time_completed_ms)]
    assert {r.partition for r in records} == {records[0].partition}  # keyed by batch id
    assert [r.envelope.key for r in records] == ["101", "101"]
    assert [r.envelope.event_id for r in records] == [event_id(group), event_id(batch)]
    assert store.unpublished(100) == []
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM completions_outbox WHERE "
                                    "batch_id = 101 AND published_ms IS NULL")).scalar() == 0


async def test_callbacks_post_the_status_with_an_idempotency_key(
        settings: Settings, engine: sa.Engine, project: Project, receiver: Receiver) -> None:
    project(batch_with_callbacks(102, f"{receiver.url}/batch", f"{receiver.url}/group"))
    project(batch_with_callbacks(103, None))  # no callback: nobody is called
    key, group_key = idempotency_key(102, 0, 2), idempotency_key(102, 1, 1)
    async with service(settings):
        await eventually("both callbacks", lambda: receiver.for_key(key)
                         and receiver.for_key(group_key))
        await eventually("delivered", lambda: status_of(engine, key) == "delivered")
    reads = Reads(Store(engine, ""))
    ((headers, body),) = receiver.for_key(key)
    assert body == reads.batch(102, "alice")  # exactly what GET /batches/102 shows
    assert body["complete"] is True and body["state"] == "failure"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Hailstream-Event"] == "batch.completed"
    assert headers["X-Hailstream-Attempt"] == "1"
    ((group_headers, group_body),) = receiver.for_key(group_key)
    assert group_body == reads.group(102, 1, "alice")
    assert group_headers["X-Hailstream-Event"] == "job_group.completed"
    assert len(receiver.requests) == 2
    row = delivery(engine, key)
    assert (row.attempts, row.last_error, row.url) == (1, None, f"{receiver.url}/batch")
    assert row.time_delivered_ms is not None
    assert delivery(engine, idempotency_key(103, 0, 2)) is None


async def test_a_failing_receiver_is_retried_until_it_answers_2xx(
        settings: Settings, engine: sa.Engine, project: Project, receiver: Receiver) -> None:
    receiver.statuses = [500, 500]
    project(batch_with_callbacks(104, f"{receiver.url}/cb"))
    key = idempotency_key(104, 0, 2)
    async with service(settings):
        await eventually("delivered", lambda: status_of(engine, key) == "delivered")
    requests = receiver.for_key(key)
    assert [h["X-Hailstream-Attempt"] for h, _ in requests] == ["1", "2", "3"]
    assert all(body == requests[0][1] for _, body in requests)  # the same body every time
    row = delivery(engine, key)
    assert row.attempts == 3 and row.last_error.startswith("HTTP 500")


async def test_a_receiver_that_never_answers_2xx_fails_after_max_attempts(
        settings: Settings, engine: sa.Engine, project: Project, receiver: Receiver) -> None:
    receiver.statuses = [503] * 10
    project(batch_with_callbacks(105, f"{receiver.url}/cb"))
    key = idempotency_key(105, 0, 2)
    cs = msgspec.structs.replace(FAST, max_attempts=3)
    async with service(settings, cs):
        await eventually("failed", lambda: status_of(engine, key) == "failed")
    assert len(receiver.for_key(key)) == 3
    row = delivery(engine, key)
    assert row.attempts == 3 and row.next_attempt_ms is None
    assert row.last_error.startswith("HTTP 503")


async def test_a_restarted_service_resumes_pending_deliveries(
        settings: Settings, engine: sa.Engine, project: Project, receiver: Receiver) -> None:
    receiver.statuses = [500] * 1000
    project(batch_with_callbacks(106, f"{receiver.url}/cb"))
    key = idempotency_key(106, 0, 2)
    slow = msgspec.structs.replace(FAST, backoff_base_s=60.0, backoff_max_s=60.0)
    async with service(settings, slow):
        await eventually("a first attempt", lambda: receiver.for_key(key)
                         and delivery(engine, key).next_attempt_ms > time.time() * 1000 + 10_000)
    row = delivery(engine, key)
    assert (row.status, row.attempts) == ("pending", 1)
    with engine.begin() as conn:  # the backoff is over (rather than waiting a minute)
        conn.execute(sa.text("UPDATE callback_deliveries SET next_attempt_ms = 0 "
                             "WHERE idempotency_key = :k"), {"k": key})
    receiver.statuses = []
    async with service(settings):
        await eventually("delivered", lambda: status_of(engine, key) == "delivered")
    assert [h["X-Hailstream-Attempt"] for h, _ in receiver.for_key(key)] == ["1", "2"]
    with engine.connect() as conn:  # the restart did not owe the callback twice
        assert conn.execute(sa.text("SELECT COUNT(*) FROM callback_deliveries WHERE "
                                    "batch_id = 106")).scalar() == 1


async def test_a_claim_that_never_reported_is_attempted_again(
        settings: Settings, engine: sa.Engine, project: Project, receiver: Receiver) -> None:
    project(batch_with_callbacks(107, f"{receiver.url}/cb"))
    key = idempotency_key(107, 0, 2)
    quick = msgspec.structs.replace(FAST, http_timeout_s=0.2, claim_margin_s=0.3)
    async with service(settings, quick):
        await eventually("delivered", lambda: status_of(engine, key) == "delivered")
    with engine.begin() as conn:  # as if owed afresh, then claimed by a dispatcher that died
        conn.execute(sa.text("UPDATE callback_deliveries SET status = 'pending', attempts = 0, "
                             "next_attempt_ms = 0 WHERE idempotency_key = :k"), {"k": key})
    # The dead dispatcher's claim lasts 3 s, not the service's own 0.5: the service's start
    # alone can take half a second on a loaded machine, and the claim must still hold when
    # the test looks (CI once saw it expired and the delivery made again by then).
    claim_s = 3.0
    claimed_at = time.monotonic()
    (claimed,) = CompletionsStore(engine).claim_due(int(time.time() * 1000), 10,
                                                    int(claim_s * 1000)).deliveries
    assert claimed.key == key and claimed.attempt == 1
    async with service(settings, quick):
        await asyncio.sleep(0.2)
        still = status_of(engine, key)
        held_s = time.monotonic() - claimed_at
        assert held_s < claim_s and still == "pending"  # still claimed: not taken over
        await eventually("delivered again", lambda: status_of(engine, key) == "delivered")
    assert time.monotonic() - claimed_at >= claim_s  # only once the claim had expired
    assert [h["X-Hailstream-Attempt"] for h, _ in receiver.for_key(key)] == ["1", "2"]


class CountingStore(CompletionsStore):
    """The store, counting the sender's looks for due deliveries."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.claims = 0

    def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> Claimed:
        self.claims += 1
        return super().claim_due(now_ms, limit, claim_ms)


async def test_an_idle_sender_sleeps_until_a_delivery_is_due(
        engine: sa.Engine, receiver: Receiver) -> None:
    key = idempotency_key(109, 0, 2)
    store = CountingStore(engine)
    now = int(time.time() * 1000)
    with engine.begin() as conn:  # owed, due in 1.5 s (as a retry's backoff leaves it)
        CompletionsStore.add_deliveries(conn, [NewDelivery(
            Completion(109, 0, 2, "failure", 1, 1, 0, T0), f"{receiver.url}/cb", "{}")], now)
        conn.execute(sa.text("UPDATE callback_deliveries SET next_attempt_ms = :t "
                             "WHERE idempotency_key = :k"), {"t": now + 1_500, "k": key})
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        sender = CallbackSender(FAST, store, session)
        task = asyncio.create_task(sender.run(stop))
        try:
            await asyncio.sleep(1.0)
            assert status_of(engine, key) == "pending" and not receiver.for_key(key)
            assert store.claims == 1  # one look at the start, then asleep until it is due
            await eventually("delivered", lambda: status_of(engine, key) == "delivered",
                             within_s=10)
            delivered_after_s = time.time() - now / 1000
            claims = store.claims
            await asyncio.sleep(1.0)
            assert store.claims == claims  # nothing pending: asleep for idle_s
        finally:
            stop.set()
            await task
    assert 1.5 <= delivered_after_s < 5
    assert [h["X-Hailstream-Attempt"] for h, _ in receiver.for_key(key)] == ["1"]


async def test_the_example_consumer_prints_each_completion_once(settings: Settings) -> None:
    batch = Completion(108, 0, 2, "success", 2, 0, 0, T0)
    group = Completion(108, 3, 1, "cancelled", 0, 0, 1, T0)
    async with Publisher(settings.log) as pub:
        envelopes = [wrap(event_of(c), event_id=event_id(c), time_ms=T0)
                     for c in (batch, batch, group)]  # the batch's published twice
        await pub.publish_many(envelopes)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "examples" / "completions_consumer.py"),
        "--bootstrap", settings.log.bootstrap_servers,
        "--topic-prefix", settings.log.topic_prefix, "--from", "earliest", "--max", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(x) for x in out.decode().splitlines()]
    assert lines == [
        {"event_id": event_id(batch), "kind": "batch", "batch_id": 108, "job_group_id": 0,
         "outcome": "success", "n_jobs": 2, "n_succeeded": 2, "n_failed": 0, "n_cancelled": 0,
         "time_completed_ms": T0},
        {"event_id": event_id(group), "kind": "job_group", "batch_id": 108, "job_group_id": 3,
         "outcome": "cancelled", "n_jobs": 1, "n_succeeded": 0, "n_failed": 0,
         "n_cancelled": 1, "time_completed_ms": T0}]
