"""Ingest and shared storage: job logs served from the log root, specs stored before publishing.

The projection is built through the projector's sink on a migrated database (no broker): the
attempts the log endpoints look up are the ones the sink wrote. Ingest's web app runs on a free
port with a publisher that records events instead of sending them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from core.errors import BadRequest, NotFound
from core.resources import default_config
from schemas.base import AttemptResource, JobResources
from schemas.batch import JobRecord, JobsSubmitted
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from schemas.envelope import Envelope
from schemas.events import AnyEvent
from schemas.execution import AttemptLost, JobCompleted, JobScheduled, JobStarted
from services.common import procs
from services.common.log import LogPosition, Publisher
from services.common.settings import DatabaseSettings, LogSettings
from services.common.specstore import LocalSpecStore
from services.ingest.app import create_app
from services.ingest.billing import Billing
from services.ingest.commands import Commands
from services.ingest.reads import Reads
from services.ingest.store import Store
from services.projector.sink import Sink
from services.worker.logstore import LocalLogStore
from services.worker.runtime import Outcome
from services.worker.status import job_status

from .projection_helpers import T0, Stream, job, submission

pytestmark = pytest.mark.integration

TOKEN = "secret-token"


def files_job(job_id: int) -> JobRecord:
    spec = {"job_id": job_id, "input_files": [{"from": "gs://b/x", "to": "/io/x"}]}
    return JobRecord(job_id=job_id, job_group_id=0, inst_coll="standard",
                     resources=JobResources(cores_mcpu=1000, memory_bytes=1 << 30),
                     spec=json.dumps(spec))


RES = [AttemptResource(resource="service-fee/1", quantity=1000),
       AttemptResource(resource="compute/n1-preemptible/1", quantity=1000)]


def sj(j: int, a: str) -> JobScheduled:
    return JobScheduled(batch_id=1, job_id=j, attempt_id=a, instance_name="w1",
                        inst_coll="standard", cores_mcpu=1000, resources=RES)


def mjs(j: int, a: str, t: int) -> JobStarted:
    return JobStarted(batch_id=1, job_id=j, attempt_id=a, instance_name="w1",
                      start_time_ms=T0 + t)


SUBMITTED = [job(1), job(2), files_job(3), job(4), job(5), job(6)]


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> LocalSpecStore:
    """The bunch's specs, stored as ingest stores them before publishing the bunch."""
    specs = LocalSpecStore(tmp_path_factory.mktemp("specs"))
    specs.write_bunch(1, [(j.job_id, j.spec) for j in SUBMITTED])
    return specs


@pytest.fixture(scope="module")
def store(migrated_db: DatabaseSettings) -> Iterator[Store]:
    """Batch 1 of alice (project proj), projected by the sink:

    job 1: attempt a1 lost, a2 succeeded; job 2: never ran; job 3 (with input files): a1
    running; job 4: a1 lost, not scheduled again; job 5: a1 started and has written nothing
    (no log file: a worker makes it on the first byte); job 6: a1 scheduled, not started.
    """
    engine = sa.create_engine(migrated_db.url())
    sink = Sink(engine, "test-ingest-storage")
    sink.apply(Stream("control-events").records([
        UserCreated(user="alice"), UserCreated(user="eve"),
        TokenIssued(user="alice", token_id="t1",
                    token_sha256=hashlib.sha256(TOKEN.encode()).hexdigest()),
        BillingProjectCreated(billing_project="proj"),
        BillingProjectMemberAdded(billing_project="proj", user="alice")]))
    lost = {"instance_name": "w1", "reason": "preempted", "end_time_ms": T0 + 15}
    sink.apply(Stream().records([
        *submission(1, 1, SUBMITTED, create=True, user="alice"),
        sj(1, "a1"), mjs(1, "a1", 10), AttemptLost(batch_id=1, job_id=1, attempt_id="a1", **lost),
        sj(1, "a2"), mjs(1, "a2", 20),
        # compact: no document, the facts it follows from
        JobCompleted(batch_id=1, job_id=1, attempt_id="a2", instance_name="w1",
                     state="Success", exit_code=0, start_time_ms=T0 + 20, end_time_ms=T0 + 30,
                     resources=RES, main_start_ms=T0 + 21, main_end_ms=T0 + 29,
                     region="us-central1"),
        sj(3, "a1"), mjs(3, "a1", 10),
        sj(4, "a1"), mjs(4, "a1", 10), AttemptLost(batch_id=1, job_id=4, attempt_id="a1", **lost),
        sj(5, "a1"), mjs(5, "a1", 10), sj(6, "a1"),
    ]))
    yield Store(engine, "test-ingest-storage")
    engine.dispose()


@pytest.fixture
def logs(tmp_path: Path) -> LocalLogStore:
    logs = LocalLogStore(tmp_path / "logs")
    for job_id, attempt_id, text in [(1, "a1", "first try\n"), (1, "a2", "second try\n"),
                                     (3, "a1", "still running\n"), (4, "a1", "lost one\n")]:
        writer = logs.writer(1, job_id, attempt_id, "main")
        writer.write(text.encode())
        writer.close()
    return logs


def test_the_job_spec_comes_from_the_spec_store(store: Store, specs: LocalSpecStore) -> None:
    got = Reads(store, specs=specs).job(1, 3, "alice")["spec"]
    assert got == json.loads(files_job(3).spec)
    assert got["input_files"] == [{"from": "gs://b/x", "to": "/io/x"}]
    # No spec storage (ingest stores none either): the job shows no spec, and is still read.
    without = Reads(store).job(1, 3, "alice")
    assert without["spec"] is None and without["state"] == "Running"


def test_a_compact_mjcs_document_is_rendered_as_the_worker_had_it(
        store: Store, specs: LocalSpecStore) -> None:
    """Job 1's MJC carried no status document: the API shows the one the worker made."""
    worker_doc = job_status(
        spec=json.loads(job(1).spec), outcomes={"main": Outcome(
            state="Success", exit_code=0, start_time_ms=T0 + 21, end_time_ms=T0 + 29)},
        batch_id=1, job_id=1, attempt_id="a2", user="alice", worker="w1",
        region="us-central1", start_time_ms=T0 + 20, end_time_ms=T0 + 30, resources=RES)
    assert Reads(store, specs=specs).job(1, 1, "alice")["status"] == worker_doc
    assert worker_doc["container_statuses"]["main"]["container_status"]["exit_code"] == 0
    assert [r["name"] for r in worker_doc["resources"]] == [
        "compute/n1-preemptible/1", "service-fee/1"]
    # A job that has not ended has no document.
    assert Reads(store, specs=specs).job(1, 3, "alice")["status"] is None


def test_the_log_is_the_latest_attempts(store: Store, logs: LocalLogStore,
                                        specs: LocalSpecStore) -> None:
    reads = Reads(store, logs, specs)
    assert reads.log(1, 1, "alice") == {"main": "second try\n"}
    assert reads.log(1, 2, "alice") == {"main": None}  # never ran
    assert reads.log(1, 3, "alice") == {"main": "still running\n", "input": None}
    assert reads.log(1, 4, "alice") == {"main": "lost one\n"}  # the last attempt that started
    assert reads.log(1, 5, "alice") == {"main": ""}  # started, no output yet: no file
    assert reads.log(1, 6, "alice") == {"main": None}  # scheduled, not started
    # Without log storage, no job shows a log.
    assert Reads(store, specs=specs).log(1, 1, "alice") == {"main": None}
    with pytest.raises(NotFound):
        reads.log(1, 1, "eve")


@pytest.mark.parametrize(("job_id", "container", "attempt_id", "expected"), [
    (1, "main", None, b"second try\n"),
    (1, "main", "a2", b"second try\n"),
    (1, "main", "a1", b"first try\n"),
    (3, "main", None, b"still running\n"),
    (1, "sidecar", None, BadRequest("unknown container")),
    (1, "main", "nope", NotFound("has no attempt nope")),
    (1, "input", None, NotFound("none was stored for attempt a2")),
    (2, "main", None, NotFound("it has not run")),
    (5, "main", None, b""),
    (5, "main", "a1", b""),
    (6, "main", None, NotFound("none was stored for attempt a1")),
    (9, "main", None, NotFound("not found")),
], ids=["latest", "named", "earlier", "running", "unknown-container", "unknown-attempt",
        "no-such-log", "not-run", "started-no-output", "named-started-no-output",
        "scheduled-not-started", "no-such-job"])
def test_container_logs(store: Store, logs: LocalLogStore, job_id: int, container: str,
                        attempt_id: str | None, expected: bytes | Exception) -> None:
    reads = Reads(store, logs)
    if isinstance(expected, bytes):
        assert reads.container_log(1, job_id, container, "alice", attempt_id) == expected
    else:
        with pytest.raises(type(expected), match=str(expected)):
            reads.container_log(1, job_id, container, "alice", attempt_id)


class RecordingPublisher(Publisher):
    """Records what would be published, and what the spec store held at that moment."""

    def __init__(self, specs: LocalSpecStore) -> None:
        super().__init__(LogSettings())
        self.specs = specs
        self.published: list[AnyEvent] = []
        self.stored_at_publish: list[str | None] = []

    async def publish_many(self, events: Sequence[AnyEvent | Envelope], *,
                           partition: int | None = None) -> list[LogPosition]:
        for e in events:
            assert not isinstance(e, Envelope)
            self.published.append(e)
            if isinstance(e, JobsSubmitted):
                self.stored_at_publish += [LocalSpecStore(self.specs.root).read(
                    e.batch_id, r.job_id) for r in e.jobs]
        return []  # nothing to wait for


class BrokenSpecStore(LocalSpecStore):
    def _store(self, batch_id: int, first_job_id: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")


@pytest.fixture
async def api(store: Store, logs: LocalLogStore, tmp_path: Path
              ) -> AsyncIterator[tuple[str, RecordingPublisher, aiohttp.ClientSession]]:
    specs = LocalSpecStore(tmp_path / "specs")
    publisher = RecordingPublisher(specs)
    app = create_app(store, Commands(store, publisher, default_config(), specs=specs),
                     Billing(store, publisher), logs=logs)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = procs.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            yield f"http://127.0.0.1:{port}/api/v1alpha/batches", publisher, http
    finally:
        await runner.cleanup()


async def test_log_endpoints_serve_the_log_root(
        api: tuple[str, RecordingPublisher, aiohttp.ClientSession]) -> None:
    base, _, http = api
    async with http.get(f"{base}/1/jobs/1/log") as r:
        assert (r.status, await r.json()) == (200, {"main": "second try\n"})
    async with http.get(f"{base}/1/jobs/2/log") as r:
        assert (r.status, await r.json()) == (200, {"main": None})
    async with http.get(f"{base}/1/jobs/1/log/main") as r:
        assert (r.status, await r.read()) == (200, b"second try\n")
    async with http.get(f"{base}/1/jobs/1/log/main", params={"attempt_id": "a1"}) as r:
        assert (r.status, await r.read()) == (200, b"first try\n")
    async with http.get(f"{base}/1/jobs/1/log/sidecar") as r:
        assert r.status == 400 and "unknown container" in await r.text()
    async with http.get(f"{base}/1/jobs/2/log/main") as r:
        assert r.status == 404 and "has not run" in await r.text()


def create_fast(token: str, n: int) -> dict[str, Any]:
    return {"batch": {"billing_project": "proj", "n_jobs": n, "token": token},
            "job_groups": [],
            "bunch": [{"job_id": i, "process": {"type": "docker", "image": "ubuntu:24.04",
                                                "command": ["echo", str(i)]}}
                      for i in range(1, n + 1)]}


async def test_specs_are_stored_before_the_jobs_are_published(
        api: tuple[str, RecordingPublisher, aiohttp.ClientSession], tmp_path: Path) -> None:
    base, publisher, http = api
    async with http.post(f"{base}/create-fast", json=create_fast("t-specs", 3)) as r:
        assert r.status == 200, await r.text()
        batch_id = (await r.json())["id"]
    (submitted,) = [e for e in publisher.published if isinstance(e, JobsSubmitted)]
    # The event still carries the specs, and each was in the store before it was published.
    assert publisher.stored_at_publish == [r.spec for r in submitted.jobs]
    specs = LocalSpecStore(tmp_path / "specs")
    for i in (1, 2, 3):
        spec = specs.read(batch_id, i)
        assert spec is not None and json.loads(spec)["process"]["command"] == ["echo", str(i)]


async def test_specs_that_cannot_be_stored_fail_the_request_and_publish_nothing(
        store: Store, tmp_path: Path) -> None:
    publisher = RecordingPublisher(LocalSpecStore(tmp_path / "specs"))
    commands = Commands(store, publisher, default_config(),
                        specs=BrokenSpecStore(tmp_path / "specs"))
    app = create_app(store, commands, Billing(store, publisher))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = procs.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                http.post(f"http://127.0.0.1:{port}/api/v1alpha/batches/create-fast",
                          json=create_fast("t-broken", 2)) as r:
            assert r.status == 503
            assert "could not store the job specs" in await r.text()
    finally:
        await runner.cleanup()
    assert publisher.published == []
