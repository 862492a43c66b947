"""Callbacks end to end: the official client creates a batch with a callback URL, the scheduler
runs it, and the completions service POSTs its status; the completions topic announces it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core.status import format_time_ms
from schemas.batch import BatchCompleted, JobGroupCompleted
from services.common.log import ConsumerOptions, LogConsumer
from services.common.settings import TOPIC_COMPLETIONS, DatabaseSettings, LogSettings

from .conftest import SCHEDULER_ENV, System, start_system, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COMPLETIONS_ENV = {"HS_COMPLETIONS_POLL_S": "0.1", "HS_COMPLETIONS_BACKOFF_BASE_S": "0.2"}
# Cost grows with billing until the last heartbeat lands, and these are about when it is read.
MOVING = {"cost", "cost_breakdown", "msec_mcpu"}


class Receiver:
    """A callback endpoint on a free port, in a thread: records every POST."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def at(self, path: str) -> list[tuple[dict[str, str], Any]]:
        return [(h, b) for p, h, b in self.requests if p == path]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def called_back_system(broker: str, migrated_db: DatabaseSettings,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The whole system (scheduler and workers) with the completions service."""
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("callbacks"),
                            scheduler_env=SCHEDULER_ENV, completions_env=COMPLETIONS_ENV)


def completions_of(log: LogSettings, batch_id: int, n: int) -> list[Any]:
    """The completions of ``batch_id`` on the topic, once ``n`` are there (or 60 s passed)."""
    async def read() -> list[Any]:
        options = ConsumerOptions(name="e2e-reader", topics=[TOPIC_COMPLETIONS], group=False)
        found: list[Any] = []
        async with LogConsumer(log, options) as consumer:
            deadline = time.monotonic() + 60
            while len(found) < n and time.monotonic() < deadline:
                found += [r.envelope.event for r in await consumer.next_batch()
                          if getattr(r.envelope.event, "batch_id", None) == batch_id]
        return found
    return asyncio.run(read())


def test_a_batch_with_a_callback_is_called_back_with_its_status(
        called_back_system: System, receiver: Receiver) -> None:
    r = called_back_system.hail("callbacks", f"{receiver.url}/batch", f"{receiver.url}/group")
    batch_id, batch, group = r["id"], r["batch"], r["group"]
    assert batch["complete"] is True and batch["state"] == "failure"

    def posted(path: str) -> list[tuple[dict[str, str], Any]]:
        return [(h, b) for h, b in receiver.at(path) if b.get("id", b.get("batch_id")) == batch_id]

    ((headers, body),) = wait_for("the batch callback", lambda: posted("/batch"), timeout=60)
    assert headers["Idempotency-Key"] == f"completion-{batch_id}-0-2"
    assert headers["X-Hailstream-Event"] == "batch.completed"
    assert headers["Content-Type"] == "application/json"
    assert {k: v for k, v in body.items() if k not in MOVING} == {
        k: v for k, v in batch.items() if k not in MOVING}
    assert body.keys() == batch.keys()

    ((group_headers, group_body),) = wait_for("the group callback", lambda: posted("/group"),
                                              timeout=60)
    assert group_headers["Idempotency-Key"] == f"completion-{batch_id}-{r['group_id']}-1"
    assert group_headers["X-Hailstream-Event"] == "job_group.completed"
    assert {k: v for k, v in group_body.items() if k not in MOVING} == {
        k: v for k, v in group.items() if k not in MOVING}
    assert group_body["state"] == "success" and group_body["attributes"] == {"name": "grouped"}

    events = completions_of(called_back_system.log, batch_id, 2)
    (done,) = [e for e in events if isinstance(e, BatchCompleted)]
    assert done == BatchCompleted(batch_id=batch_id, outcome="failure", n_jobs=2, n_succeeded=1,
                                  n_failed=1, n_cancelled=0,
                                  time_completed_ms=done.time_completed_ms)
    (group_done,) = [e for e in events if isinstance(e, JobGroupCompleted)]
    assert group_done == JobGroupCompleted(
        batch_id=batch_id, job_group_id=r["group_id"], outcome="success", n_jobs=1,
        n_succeeded=1, n_failed=0, n_cancelled=0, time_completed_ms=group_done.time_completed_ms)
    assert body["time_completed"] == format_time_ms(done.time_completed_ms)
