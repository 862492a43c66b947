"""Batch events: submission, cancellation, deletion and completion, keyed by batch id.

Ids in these events are absolute: ingest resolves ``in_update_*`` ids of the API into absolute
job and job-group ids before it appends, so a consumer never needs the update's start offsets to
interpret a job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import msgspec

from schemas import topics
from schemas.base import BatchEvent, BatchOutcome, CancelReason, JobResources


class BatchCreated(BatchEvent, frozen=True, kw_only=True, tag="batch.created"):
    """A batch now exists, with no updates and no jobs. Idempotent per (user, token).

    ``empty``: created with no jobs and no groups to come (no update was opened with it), so it
    is complete at once, as the API promises for a batch with no jobs; a later update reopens it.
    """

    user: str
    billing_project: str
    token: str
    attributes: dict[str, str] = {}
    callback: str | None = None
    cancel_after_n_failures: int | None = None
    empty: bool = False


class UpdateOpened(BatchEvent, frozen=True, kw_only=True, tag="batch.update_opened"):
    """An update reserved job ids ``[start_job_id, start_job_id + n_jobs)`` and group ids alike."""

    update_id: int
    token: str
    n_jobs: int
    n_job_groups: int
    start_job_id: int
    start_job_group_id: int


class JobGroupRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One job group of a bunch, with absolute ids. The root group of a batch is 0."""

    job_group_id: int
    parent_id: int
    attributes: dict[str, str] = {}
    callback: str | None = None
    cancel_after_n_failures: int | None = None


class JobGroupsSubmitted(BatchEvent, frozen=True, kw_only=True, tag="batch.job_groups_submitted"):
    """A bunch of job groups of an open update. Resubmitting the same bunch is a no-op."""

    update_id: int
    job_groups: list[JobGroupRecord]


class JobHead(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One job of a bunch without its spec (see :class:`JobHeadsSubmitted`).

    What the projector and the scheduler read of a job. ``inst_coll`` is the instance
    collection chosen at submission from the resources.
    """

    job_id: int
    job_group_id: int
    parent_ids: list[int] = []
    always_run: bool = False
    n_max_attempts: int = 20
    resources: JobResources
    inst_coll: str
    attributes: dict[str, str] = {}


class JobRecord(JobHead, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One job of a bunch, with absolute ids and what scheduling needs already extracted.

    ``spec`` is the job's spec (JSON text), or empty where the bunch carries its jobs' specs
    together (:attr:`JobsSubmitted.specs`).
    """

    spec: str = ""


class JobHeadsSubmitted(BatchEvent, frozen=True, kw_only=True, tag="batch.jobs_submitted"):
    """A :class:`JobsSubmitted` read without its jobs' specs: a consumer's view, never appended.

    The projector and the scheduler never read a spec (workers read them from the spec store),
    and decoding a bunch's specs was a third of their decode of it and most of its memory.
    Code that handles a bunch takes this class: a ``JobsSubmitted`` is one.
    """

    update_id: int
    jobs: Sequence[JobHead]


class JobsSubmitted(JobHeadsSubmitted, frozen=True, kw_only=True, tag="batch.jobs_submitted"):
    """A bunch of jobs of an open update. Resubmitting the same bunch is a no-op.

    The jobs' specs come one of two ways. ``specs``: the bunch's request body as the client sent
    it, a JSON array whose elements are the specs of ``jobs`` in order (what ingest appends for
    a bunch of the jobs endpoint; its jobs' ``spec`` are empty). Else each job's ``spec`` (the
    fast paths' bunches, and every bunch appended before ``specs`` existed). Carrying the body
    whole, ingest never cuts it into a thousand strings nor encodes them one by one
    (docs/performance.md). :meth:`spec_texts` reads either.
    """

    jobs: list[JobRecord]
    specs: str = ""

    def spec_texts(self) -> list[str]:
        """Each job's spec as JSON text, in the order of ``jobs``.

        Raises:
            ValueError: ``specs`` is not a JSON array of one element per job.

        """
        if not self.specs:
            return [job.spec for job in self.jobs]
        try:
            raws = _RAW_ARRAY.decode(self.specs)
        except msgspec.DecodeError as e:
            raise ValueError(f"the bunch's specs are not a JSON array: {e}") from None
        if len(raws) != len(self.jobs):
            raise ValueError(f"the bunch has {len(self.jobs)} jobs but {len(raws)} specs")
        return [str(raw, "utf-8") for raw in raws]


_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


class UpdateCommitted(BatchEvent, frozen=True, kw_only=True, tag="batch.update_committed"):
    """The update's jobs and groups become visible and its jobs become Ready or Pending."""

    update_id: int
    n_jobs: int
    n_job_groups: int


class BatchCancelRequested(BatchEvent, frozen=True, kw_only=True, tag="batch.cancel_requested"):
    """Someone (or the billing limit) asked to cancel the batch. Not yet a fact."""

    requested_by: str | None = None
    reason: CancelReason = "user"


class BatchCancelled(BatchEvent, frozen=True, kw_only=True, tag="batch.cancelled"):
    """The batch is cancelled: nothing new is scheduled, non-always_run jobs will be cancelled."""

    reason: CancelReason = "user"


class JobGroupCancelRequested(BatchEvent, frozen=True, kw_only=True,
                              tag="job_group.cancel_requested"):
    """Someone asked to cancel a job group (and so its descendants)."""

    job_group_id: int
    requested_by: str | None = None
    reason: CancelReason = "user"


class JobGroupCancelled(BatchEvent, frozen=True, kw_only=True, tag="job_group.cancelled"):
    """The job group and its descendants are cancelled."""

    job_group_id: int
    reason: CancelReason = "user"


class BatchDeleted(BatchEvent, frozen=True, kw_only=True, tag="batch.deleted"):
    """The batch is deleted: cancelled if still running, and invisible to reads."""

    requested_by: str | None = None


class BatchCompleted(BatchEvent, frozen=True, kw_only=True, tag="batch.completed"):
    """The last job of a committed batch ended. Published to the completions topic."""

    topic: ClassVar[str] = topics.COMPLETIONS
    outcome: BatchOutcome
    n_jobs: int
    n_succeeded: int
    n_failed: int
    n_cancelled: int
    time_completed_ms: int


class JobGroupCompleted(BatchEvent, frozen=True, kw_only=True, tag="job_group.completed"):
    """The last job of a job group (recursively) ended. Published to the completions topic."""

    topic: ClassVar[str] = topics.COMPLETIONS
    job_group_id: int
    outcome: BatchOutcome
    n_jobs: int
    n_succeeded: int
    n_failed: int
    n_cancelled: int
    time_completed_ms: int
