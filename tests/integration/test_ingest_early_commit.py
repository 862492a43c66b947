"""A commit of an update whose every job came through this ingest is answered from the log.

Ingest tallies the job ids of the bunches it appended (the broker acknowledged them); when they
cover the update, the commit needs no projected counts: it is appended and answered while the
projector may still be applying the bunches, and the reads of that batch wait for it instead
(read-your-writes). Anything else (bunches another process appended, too few jobs) takes the
projected counts as before. The log is the real broker; the projector's part is played by the
sink and by setting ``applied_offsets``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from core.errors import BadRequest, NotFound, Unavailable
from core.resources import default_config
from schemas import codec
from schemas.batch import BatchCancelled, JobsSubmitted, UpdateCommitted
from schemas.envelope import wrap
from services.common import procs
from services.common.settings import DatabaseSettings, LogSettings
from services.common.specstore import LocalSpecStore
from services.ingest.app import create_app
from services.ingest.billing import Billing
from services.ingest.commands import Commands
from services.ingest.store import User

from .ingest_harness import ALICE, WAIT_S, Harness, open_harness
from .projection_helpers import job, submission

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(migrated_db: DatabaseSettings, log_settings: LogSettings
                  ) -> AsyncIterator[Harness]:
    async with open_harness(migrated_db, log_settings, "test-early-commit") as h:
        yield h


def bunch(*ids: int) -> bytes:
    return msgspec.json.encode([{"job_id": i, "process": {"type": "docker",
                                                          "image": "ubuntu:24.04",
                                                          "command": ["true"]}} for i in ids])


async def test_the_commit_is_answered_before_the_projector_applied_the_bunches(
        harness: Harness) -> None:
    harness.project(*submission(1, 1, [job(i) for i in range(1, 5)], create=True,
                                commit=False)[:2])
    await harness.commands.submit_jobs(1, 1, bunch(1, 2), ALICE)
    await harness.commands.submit_jobs(1, 1, bunch(2, 3), ALICE)  # a retried job counts once
    await harness.commands.submit_jobs(1, 1, bunch(4), ALICE)
    t0 = time.monotonic()
    assert await harness.commands.commit(1, 1, ALICE) == {"start_job_id": 1,
                                                          "start_job_group_id": 1}
    assert time.monotonic() - t0 < WAIT_S  # it did not wait for the projector
    assert await harness.log_ends() == 4  # three bunches, then the commit

    # The projector has applied none of it: a read of the batch waits for it (bounded) ...
    t0 = time.monotonic()
    await harness.commands.settle(1, "alice")
    assert time.monotonic() - t0 >= WAIT_S
    # ... and, once it did, no longer waits.
    harness.project(JobsSubmitted(batch_id=1, update_id=1, jobs=[job(i) for i in range(1, 5)]),
                    UpdateCommitted(batch_id=1, update_id=1, n_jobs=4, n_job_groups=0))
    await harness.projector_at_end()
    t0 = time.monotonic()
    await harness.commands.settle(1, "alice")
    await harness.commands.settle(None, "alice")
    assert time.monotonic() - t0 < WAIT_S


async def test_a_second_commit_or_a_late_bunch_is_refused_before_the_first_is_projected(
        harness: Harness) -> None:
    harness.project(*submission(2, 1, [job(1), job(2)], create=True, commit=False)[:2])
    await harness.commands.submit_jobs(2, 1, bunch(1, 2), ALICE)
    await harness.commands.commit(2, 1, ALICE)
    with pytest.raises(BadRequest, match="update 1 is already committed"):
        await harness.commands.commit(2, 1, ALICE)
    with pytest.raises(BadRequest, match="update 1 is already committed"):
        await harness.commands.submit_jobs(2, 1, bunch(2), ALICE)
    assert await harness.log_ends() == 2  # the bunch and one commit


async def test_a_bunch_needs_a_visible_uncancelled_batch_and_an_open_update(
        harness: Harness) -> None:
    """Each refusal of a bunch names what is wrong, and nothing reaches the log."""
    harness.project(*submission(5, 1, [job(1)], create=True, commit=False)[:2])
    harness.project(*submission(6, 1, [job(1)], create=True, commit=False)[:2],
                    BatchCancelled(batch_id=6))
    await harness.projector_at_end()
    before = await harness.log_ends()
    with pytest.raises(NotFound, match="batch 99 not found"):
        await harness.commands.submit_jobs(99, 1, bunch(1), ALICE)
    with pytest.raises(NotFound, match="batch 5 not found"):
        await harness.commands.submit_jobs(5, 1, bunch(1), User("mallory", False))
    with pytest.raises(NotFound, match="update 7 of batch 5 not found"):
        await harness.commands.submit_jobs(5, 7, bunch(1), ALICE)
    with pytest.raises(BadRequest, match="to a cancelled batch"):
        await harness.commands.submit_jobs(6, 1, bunch(1), ALICE)
    assert await harness.log_ends() == before
    await harness.commands.submit_jobs(5, 1, bunch(1), ALICE)  # the open update takes it
    assert await harness.log_ends() == before + 1


async def test_too_few_jobs_through_this_process_fall_back_to_the_projected_counts(
        harness: Harness) -> None:
    harness.project(*submission(3, 1, [job(1), job(2), job(3)], create=True, commit=False)[:2])
    await harness.commands.submit_jobs(3, 1, bunch(1, 2), ALICE)
    harness.project(JobsSubmitted(batch_id=3, update_id=1, jobs=[job(1), job(2)]))
    await harness.projector_at_end()
    with pytest.raises(BadRequest, match="wrong number of jobs: expected 3, actual 2"):
        await harness.commands.commit(3, 1, ALICE)
    assert await harness.log_ends() == 1  # the bunch only


async def test_reads_through_the_api_wait_for_a_commit_answered_early(
        harness: Harness) -> None:
    harness.project(*submission(4, 1, [job(1), job(2)], create=True, commit=False)[:2])
    app = create_app(harness.commands.store, harness.commands,
                     Billing(harness.commands.store, harness.publisher))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = procs.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}/api/v1alpha/batches"
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer x"}) as http:
            async with http.post(f"{base}/4/updates/1/jobs/create", data=bunch(1, 2)) as r:
                assert r.status == 200, await r.text()
            async with http.patch(f"{base}/4/updates/1/commit") as r:
                assert r.status == 200, await r.text()

            async def read(url: str) -> float:
                t0 = time.monotonic()
                async with http.get(url) as r:
                    assert r.status == 200, await r.text()
                return time.monotonic() - t0

            # Not applied yet: the batch's reads and the user's listing wait for the projector.
            assert await read(f"{base}/4") >= WAIT_S
            assert await read(f"{base}/4/jobs") >= WAIT_S
            assert await read(base) >= WAIT_S
            harness.project(JobsSubmitted(batch_id=4, update_id=1, jobs=[job(1), job(2)]),
                            UpdateCommitted(batch_id=4, update_id=1, n_jobs=2, n_job_groups=0))
            await harness.projector_at_end()
            assert await read(f"{base}/4") < WAIT_S
            async with http.get(f"{base}/4") as r:
                body = await r.json()
            assert (body["n_jobs"], body["state"]) == (2, "running")
    finally:
        await runner.cleanup()


async def test_a_batch_on_the_log_but_not_yet_projected_is_unavailable_not_missing(
        harness: Harness) -> None:
    """A create answered after the wait bound (the projector far behind) is on the log: the
    client's next writes to that batch are told to retry (503), never that it does not exist,
    and go through once the projector applied it."""
    # Past the ids the other tests of this module project directly (the database is shared).
    harness.commands.store.allocate("batch", 100)
    t0 = time.monotonic()
    out = await harness.commands.create_batch(
        {"billing_project": "proj", "n_jobs": 1, "token": "late"}, ALICE)
    assert time.monotonic() - t0 >= WAIT_S  # answered unapplied
    b, u, start = out["id"], out["update_id"], out["start_job_id"]
    before = await harness.log_ends()
    with pytest.raises(Unavailable, match=f"batch {b} not found: it may still be on its way"):
        await harness.commands.submit_jobs(b, u, bunch(start), ALICE)
    with pytest.raises(Unavailable, match=f"batch {b} not found: it may still be on its way"):
        await harness.commands.commit(b, u, ALICE)
    with pytest.raises(Unavailable, match=f"batch {b} not found: it may still be on its way"):
        await harness.commands.cancel_batch(b, ALICE)
    assert await harness.log_ends() == before  # nothing was appended

    harness.project(*submission(b, u, [job(start)], start_job_id=start, create=True,
                                commit=False)[:2])
    await harness.projector_at_end()
    await harness.commands.submit_jobs(b, u, bunch(start), ALICE)
    assert await harness.log_ends() == before + 1
    # A batch this process did not append to is not found at once, the projector behind or not.
    t0 = time.monotonic()
    with pytest.raises(NotFound, match=f"batch {b + 1000} not found"):
        await harness.commands.submit_jobs(b + 1000, 1, bunch(1), ALICE)
    assert time.monotonic() - t0 < WAIT_S


async def test_bunches_of_an_update_share_its_check_for_a_short_while(
        harness: Harness) -> None:
    """Within ``update_check_ttl_s``, the bunches of an update reuse one check (one query),
    yet this process's cancel or commit is refused at once, and another process's cancel
    once the bound passed."""
    commands = Commands(harness.commands.store, harness.publisher, default_config(),
                        wait_s=WAIT_S, update_check_ttl_s=0.3)
    store = commands.store
    queries: list[tuple[int, int]] = []
    checked = store.batch_and_update

    def counted(batch_id: int, update_id: int, user: str) -> Any:
        queries.append((batch_id, update_id))
        return checked(batch_id, update_id, user)

    store.batch_and_update = counted  # type: ignore[method-assign]
    try:
        for b in (11, 12, 13):
            harness.project(*submission(b, 1, [job(i) for i in range(1, 5)], create=True,
                                        commit=False)[:2])
        await harness.projector_at_end()
        for j in (1, 2, 3):
            await commands.submit_jobs(11, 1, bunch(j), ALICE)
        assert queries == [(11, 1)]

        # This process's cancel: the next bunch is refused at once.
        await commands.submit_jobs(12, 1, bunch(1), ALICE)
        await commands.cancel_batch(12, ALICE)
        harness.project(BatchCancelled(batch_id=12))
        with pytest.raises(BadRequest, match="to a cancelled batch"):
            await commands.submit_jobs(12, 1, bunch(2), ALICE)

        # Another process's cancel: seen once the bound passed.
        await commands.submit_jobs(13, 1, bunch(1), ALICE)
        harness.project(BatchCancelled(batch_id=13))
        await asyncio.sleep(0.35)
        with pytest.raises(BadRequest, match="to a cancelled batch"):
            await commands.submit_jobs(13, 1, bunch(2), ALICE)

        # This process's commit: a late bunch is refused at once.
        await commands.submit_jobs(11, 1, bunch(4), ALICE)
        await commands.commit(11, 1, ALICE)
        with pytest.raises(BadRequest, match="update 1 is already committed"):
            await commands.submit_jobs(11, 1, bunch(4), ALICE)
    finally:
        store.batch_and_update = checked  # type: ignore[method-assign]


async def test_a_bunch_goes_to_the_log_and_the_spec_store_as_the_client_sent_it(
        harness: Harness, tmp_path: Path) -> None:
    """The body of a bunch is its jobs' specs as one text, in the event and in the spec store:
    never cut into a string a job on the way in, read back job by job byte for byte."""
    harness.project(*submission(21, 1, [job(i) for i in range(1, 4)], create=True,
                                commit=False)[:2])
    before = await harness.log_ends()
    store = LocalSpecStore(tmp_path)
    harness.commands.specs = store
    sent: list[object] = []
    publish_many = harness.publisher.publish_many

    async def recording(events: Any, **kw: Any) -> Any:
        sent.extend(events)
        return await publish_many(events, **kw)

    harness.publisher.publish_many = recording  # type: ignore[method-assign]
    specs = [b'{"job_id": 1, "process": {"type": "docker", "image": "u", "command": ["true"]}}',
             b'{"process":{"command":["echo","\\u00e9t\xc3\xa9"],"image":"u","type":"docker"},'
             b'"job_id":2,"attributes":{"name":"b"}}',
             b'{"job_id": 3,\n "process": {"type": "docker", "image": "u", "command": []}}']
    body = b" \n[" + b" ,\n ".join(specs) + b"]\n"
    await harness.commands.submit_jobs(21, 1, body, ALICE)
    assert await harness.log_ends() == before + 1
    (event,) = sent
    assert isinstance(event, JobsSubmitted)
    assert event.specs == body.decode()
    assert [j.spec for j in event.jobs] == ["", "", ""]
    assert event.spec_texts() == [s.decode() for s in specs]
    # As a consumer reads it back from the log, in full or as heads.
    env = codec.decode(codec.encode(wrap(event, event_id="e", time_ms=1)))
    assert env.event == event
    heads = codec.decode(codec.encode(wrap(event, event_id="e", time_ms=1)), heads=True).event
    assert [j.job_id for j in heads.jobs] == [1, 2, 3]  # type: ignore[attr-defined]
    # The spec store, read afresh, gives each job its own text.
    fresh = LocalSpecStore(tmp_path)
    assert [fresh.read(21, i) for i in (1, 2, 3)] == [s.decode() for s in specs]
    assert fresh.read(21, 4) is None


async def test_a_bunch_refused_stores_and_appends_nothing(harness: Harness,
                                                          tmp_path: Path) -> None:
    harness.project(*submission(22, 1, [job(i) for i in range(1, 3)], create=True,
                                commit=False)[:2])
    before = await harness.log_ends()
    harness.commands.specs = LocalSpecStore(tmp_path)
    with pytest.raises(BadRequest, match="job_id"):
        await harness.commands.submit_jobs(22, 1, b'[{"process": {}}]', ALICE)
    assert await harness.log_ends() == before
    assert not any(files for _, _, files in os.walk(tmp_path))
