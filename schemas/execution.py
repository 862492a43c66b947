"""Execution events of one job attempt: SJ, MJS, MJC, heartbeats, losses, cancellations.

They are keyed by batch id like every other batch event, so a job's execution history is ordered
with its submission and its batch's cancellation. An attempt is identified by
(batch_id, job_id, attempt_id); workers retry MJS and MJC until acknowledged, and consumers treat
duplicates as no-ops.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from schemas.base import (
    AttemptResource,
    BatchEvent,
    CancelReason,
    CompletedJobState,
    Event,
    InstanceLossReason,
)


class JobScheduled(BatchEvent, frozen=True, kw_only=True, tag="job.scheduled"):
    """SJ: the scheduler placed attempt ``attempt_id`` of a Ready job on an instance."""

    job_id: int
    attempt_id: str
    instance_name: str
    inst_coll: str
    cores_mcpu: int
    resources: list[AttemptResource] = []
    """What the attempt is billed for, per ms of runtime, at the rates' latest versions."""


class ScheduledAttempt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One attempt of a :class:`JobsScheduled` bunch: the fields of its own SJ."""

    job_id: int
    attempt_id: str
    instance_name: str
    inst_coll: str
    cores_mcpu: int
    resources: list[AttemptResource] = []


class JobsScheduled(BatchEvent, frozen=True, kw_only=True, tag="jobs.scheduled"):
    """SJ of several jobs of one batch, placed in one scheduling round.

    It means exactly what one :class:`JobScheduled` per attempt, in list order, would mean; the
    scheduler publishes a round's placements of a batch as one record so that every consumer
    pays its per-record cost (fetch, decode, dispatch) once per round instead of once per job.
    """

    attempts: list[ScheduledAttempt]

    def expand(self) -> list[JobScheduled]:
        """The bunch as single SJs, in order."""
        b = self.batch_id
        return [JobScheduled(batch_id=b, job_id=a.job_id, attempt_id=a.attempt_id,
                             instance_name=a.instance_name, inst_coll=a.inst_coll,
                             cores_mcpu=a.cores_mcpu, resources=a.resources)
                for a in self.attempts]

    @classmethod
    def of(cls, batch_id: int, scheduled: list[JobScheduled]) -> JobsScheduled:
        """The bunch of single SJs of batch ``batch_id``."""
        return cls(batch_id=batch_id, attempts=[
            ScheduledAttempt(job_id=s.job_id, attempt_id=s.attempt_id,
                             instance_name=s.instance_name, inst_coll=s.inst_coll,
                             cores_mcpu=s.cores_mcpu, resources=s.resources)
            for s in scheduled])


class JobStarted(BatchEvent, frozen=True, kw_only=True, tag="job.started"):
    """MJS: the worker started the attempt's main container at ``start_time_ms``."""

    job_id: int
    attempt_id: str
    instance_name: str
    start_time_ms: int
    resources: list[AttemptResource] = []


class JobCompleted(BatchEvent, frozen=True, kw_only=True, tag="job.completed"):
    """MJC: the attempt ended in ``state``; the first MJC of a job decides its final state.

    ``status`` is the worker's status document (JSON text, as clients read it under
    ``status``), ``error`` a short human-readable error when the job did not run to an exit.
    ``start_reported`` is False when the attempt ended before the worker published its MJS:
    this MJC reports the start too (with ``start_time_ms`` and ``resources``).

    The common attempt (only its main container, which ran to an exit: no error, no timeout,
    not out of memory, not cancelled) carries no ``status``: its document follows from this
    event's facts and ``main_start_ms``/``main_end_ms`` (when the main container's process
    started and ended) and ``region`` (the worker's), as
    ``services.worker.status.compact_status`` renders it for readers. Every other attempt
    carries the whole document. Older logs carry the document in every MJC.
    """

    job_id: int
    attempt_id: str
    instance_name: str
    state: CompletedJobState
    exit_code: int | None = None
    error: str | None = None
    start_time_ms: int | None = None
    end_time_ms: int
    resources: list[AttemptResource] = []
    status: str | None = None
    start_reported: bool = True
    main_start_ms: int | None = None
    main_end_ms: int | None = None
    region: str | None = None


class CompletedAttempt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One attempt of a :class:`JobsCompleted` bunch: the fields of its own MJC."""

    job_id: int
    attempt_id: str
    state: CompletedJobState
    exit_code: int | None = None
    error: str | None = None
    start_time_ms: int | None = None
    end_time_ms: int
    resources: list[AttemptResource] = []
    status: str | None = None
    start_reported: bool = True
    main_start_ms: int | None = None
    main_end_ms: int | None = None


class JobsCompleted(BatchEvent, frozen=True, kw_only=True, tag="jobs.completed"):
    """MJC of several attempts of one batch that ended on one instance at about the same time.

    It means exactly what one :class:`JobCompleted` per attempt, in list order, would mean; a
    worker publishes the completions that accumulate while it waits to publish as one record per
    batch, so every consumer pays its per-record cost once per bunch instead of once per job.
    """

    instance_name: str
    attempts: list[CompletedAttempt]
    region: str | None = None  # the instance's, as in each MJC

    def expand(self) -> list[JobCompleted]:
        """The bunch as single MJCs, in order."""
        b, inst, region = self.batch_id, self.instance_name, self.region
        return [JobCompleted(batch_id=b, job_id=a.job_id, attempt_id=a.attempt_id,
                             instance_name=inst, state=a.state, exit_code=a.exit_code,
                             error=a.error, start_time_ms=a.start_time_ms,
                             end_time_ms=a.end_time_ms, resources=a.resources, status=a.status,
                             start_reported=a.start_reported, main_start_ms=a.main_start_ms,
                             main_end_ms=a.main_end_ms, region=region)
                for a in self.attempts]

    @classmethod
    def of(cls, completed: list[JobCompleted]) -> JobsCompleted:
        """The bunch of single MJCs of one batch and one instance (ValueError otherwise)."""
        if not completed:
            raise ValueError("a bunch of MJCs needs at least one")
        first = completed[0]
        if any(c.batch_id != first.batch_id or c.instance_name != first.instance_name
               or c.region != first.region for c in completed):
            raise ValueError("the MJCs of a bunch share their batch, instance and region")
        return cls(batch_id=first.batch_id, instance_name=first.instance_name,
                   region=first.region, attempts=[
            CompletedAttempt(job_id=c.job_id, attempt_id=c.attempt_id, state=c.state,
                             exit_code=c.exit_code, error=c.error,
                             start_time_ms=c.start_time_ms, end_time_ms=c.end_time_ms,
                             resources=c.resources, status=c.status,
                             start_reported=c.start_reported, main_start_ms=c.main_start_ms,
                             main_end_ms=c.main_end_ms)
            for c in completed])


class AttemptHeartbeat(BatchEvent, frozen=True, kw_only=True, tag="attempt.heartbeat"):
    """The attempt was still running at ``rollup_time_ms``: billing accrues up to it."""

    job_id: int
    attempt_id: str
    instance_name: str
    rollup_time_ms: int


class AttemptLost(BatchEvent, frozen=True, kw_only=True, tag="attempt.lost"):
    """The attempt ended without an MJC (preemption, a lost worker).

    The job is Ready again, unless it used its ``n_max_attempts``: then it ends in Error.
    """

    job_id: int
    attempt_id: str
    instance_name: str
    reason: InstanceLossReason
    end_time_ms: int


class JobCancelled(BatchEvent, frozen=True, kw_only=True, tag="job.cancelled"):
    """The canceller (or a failed parent) cancelled a job that was not running to completion."""

    job_id: int
    reason: CancelReason


class JobsCancelled(BatchEvent, frozen=True, kw_only=True, tag="jobs.cancelled"):
    """The canceller cancelled several jobs of one batch, for one reason, in one round.

    It means exactly what one :class:`JobCancelled` per job, in list order, would mean; the
    scheduler publishes a round's cancellations of a batch as one record: cancelling a
    million-job batch was a million records, each paying its envelope, its produce, and every
    consumer's fetch, decode and dispatch (the scheduler spent half its time on those).
    """

    job_ids: list[int]
    reason: CancelReason

    def expand(self) -> list[JobCancelled]:
        """The bunch as single cancellations, in order."""
        b, reason = self.batch_id, self.reason
        return [JobCancelled(batch_id=b, job_id=j, reason=reason) for j in self.job_ids]


class JobUnschedulable(BatchEvent, frozen=True, kw_only=True, tag="job.unschedulable"):
    """The scheduler found the job cannot run now or ever (e.g. 8 cores on 4-core workers)."""

    job_id: int
    reason: str
    permanent: bool = False


# --- the rebuild's view: resources left undecoded -------------------------------------------
# Never appended: the bulk lanes of the audit's rebuild decode SJ, MJS and MJC as these (see
# schemas.envelope.BulkEnvelope). An attempt's resource list is the same in each of its three
# events and nearly the same in every attempt of a batch, yet decoding it made a struct and a
# string per resource per event, and freeing them: about a third of decoding and freeing a
# replayed event (2026-11-30, measured). The lane's fold decodes each distinct list once.
# Every field but ``resources`` is the original's (tests/schemas check that they stay so).

NO_RESOURCES = msgspec.Raw(b"\x90")
"""An empty resource list, as msgpack (what an omitted ``resources`` means)."""

_RESOURCE_LIST = msgspec.msgpack.Decoder(list[AttemptResource])


def decode_resources(raw: msgspec.Raw) -> list[AttemptResource]:
    """An undecoded resource list (msgpack), decoded and checked as the event's own would be.

    Raises:
        msgspec.DecodeError: Not msgpack, or not a list of resources (a ValidationError).

    """
    return _RESOURCE_LIST.decode(raw)


class _ResourcesUndecoded(BatchEvent, frozen=True, kw_only=True):
    """An event's view with its ``resources`` undecoded (msgpack); ``full()`` is the event."""

    event_class: ClassVar[type[BatchEvent]]
    resources: msgspec.Raw = NO_RESOURCES

    def full(self) -> BatchEvent:
        """The event itself (DecodeError if its resources are not a resource list)."""
        fields = msgspec.structs.asdict(self)
        fields["resources"] = decode_resources(self.resources)
        return self.event_class(**fields)


class RawJobScheduled(_ResourcesUndecoded, frozen=True, kw_only=True, tag="job.scheduled"):
    """A :class:`JobScheduled` with its ``resources`` undecoded (msgpack)."""

    event_class: ClassVar[type[BatchEvent]] = JobScheduled
    job_id: int
    attempt_id: str
    instance_name: str
    inst_coll: str
    cores_mcpu: int


class RawJobStarted(_ResourcesUndecoded, frozen=True, kw_only=True, tag="job.started"):
    """A :class:`JobStarted` with its ``resources`` undecoded (msgpack)."""

    event_class: ClassVar[type[BatchEvent]] = JobStarted
    job_id: int
    attempt_id: str
    instance_name: str
    start_time_ms: int


class RawJobCompleted(_ResourcesUndecoded, frozen=True, kw_only=True, tag="job.completed"):
    """A :class:`JobCompleted` with its ``resources`` undecoded (msgpack)."""

    event_class: ClassVar[type[BatchEvent]] = JobCompleted
    job_id: int
    attempt_id: str
    instance_name: str
    state: CompletedJobState
    exit_code: int | None = None
    error: str | None = None
    start_time_ms: int | None = None
    end_time_ms: int
    status: str | None = None
    start_reported: bool = True
    main_start_ms: int | None = None
    main_end_ms: int | None = None
    region: str | None = None


RAW_VIEWS: dict[type[Event], type[Event]] = {
    JobScheduled: RawJobScheduled, JobStarted: RawJobStarted, JobCompleted: RawJobCompleted}
"""Each event the rebuild's bulk lanes decode with its resources undecoded, and its view."""
