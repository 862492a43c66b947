"""Execution events of one job attempt: SJ, MJS, MJC, heartbeats, losses, cancellations.

They are keyed by batch id like every other batch event, so a job's execution history is ordered
with its submission and its batch's cancellation. An attempt is identified by
(batch_id, job_id, attempt_id); workers retry MJS and MJC until acknowledged, and consumers treat
duplicates as no-ops.
"""

from __future__ import annotations

import msgspec

from schemas.base import (
    AttemptResource,
    BatchEvent,
    CancelReason,
    CompletedJobState,
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


class ScheduledAttempt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
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


class JobUnschedulable(BatchEvent, frozen=True, kw_only=True, tag="job.unschedulable"):
    """The scheduler found the job cannot run now or ever (e.g. 8 cores on 4-core workers)."""

    job_id: int
    reason: str
    permanent: bool = False
