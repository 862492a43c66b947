"""A commit whose counts are short waits for the projector to reach the log's end.

A bunch request waits for the projector at most ``wait_s``; a commit that follows may then read
staged counts short of the update's. Ingest's commit tells that apart from a client that sent
too few jobs: it waits (bounded) until the projector has applied every partition of the batch
topic up to its end (high watermarks from the real broker), answering 503 (retryable) when the
projector is behind, 400 when it is not. The projector's part is played by the sink and by
setting ``applied_offsets``; the log is the real broker.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from core.errors import BadRequest, Unavailable
from schemas.batch import JobsSubmitted, UpdateOpened
from schemas.topics import BATCH
from services.common.log import high_watermarks
from services.common.settings import DatabaseSettings, LogSettings

from .ingest_harness import ALICE, Harness, open_harness
from .projection_helpers import job, submission

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(migrated_db: DatabaseSettings, log_settings: LogSettings
                  ) -> AsyncIterator[Harness]:
    async with open_harness(migrated_db, log_settings, "test-commit-barrier") as h:
        yield h


async def test_short_counts_while_the_projector_is_behind_are_a_503_then_the_retry_commits(
        harness: Harness) -> None:
    jobs = [job(1), job(2)]
    harness.project(*submission(1, 1, jobs, create=True, commit=False)[:2])  # created, opened
    # The bunch was accepted (it is on the log) but the projector has not applied it.
    await harness.publisher.publish_many([JobsSubmitted(batch_id=1, update_id=1, jobs=jobs)])
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="not fully projected yet"):
        await harness.commands.commit(1, 1, ALICE)
    assert time.monotonic() - t0 >= 0.5  # it waited for the projector first
    # The projector catches up: the client's retry commits.
    harness.project(JobsSubmitted(batch_id=1, update_id=1, jobs=jobs))
    await harness.projector_at_end()
    assert await harness.commands.commit(1, 1, ALICE) == {"start_job_id": 1,
                                                          "start_job_group_id": 1}
    ends = await high_watermarks(harness.settings, [BATCH])
    assert sum(ends.values()) == 2  # the bunch, then the commit


async def test_short_counts_with_the_projector_at_the_end_are_the_clients_error(
        harness: Harness) -> None:
    harness.project(*submission(2, 1, [job(1), job(2)], create=True, commit=False)[:2],
                    UpdateOpened(batch_id=2, update_id=2, token="u2", n_jobs=3, n_job_groups=0,
                                 start_job_id=3, start_job_group_id=1),
                    JobsSubmitted(batch_id=2, update_id=2, jobs=[job(3), job(4)]))
    await harness.projector_at_end()
    with pytest.raises(BadRequest, match="wrong number of jobs: expected 3, actual 2"):
        await harness.commands.commit(2, 2, ALICE)
    # nothing was appended: the log of this test's topics is empty
    assert sum((await high_watermarks(harness.settings, [BATCH])).values()) == 0
