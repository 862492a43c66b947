"""Scheduler-topic events to row operations (pure): instances, elections, event rates.

``instances`` has one row per instance name. Its state follows the instance's events:

    requested -> pending; activated -> active; deactivated -> inactive; deleted -> deleted

``deleted`` is final: a late ``instance.activated`` (a worker that came up after the scheduler
gave up on it) or ``instance.deactivated`` changes nothing, as in the scheduler's own fold
(:meth:`core.scheduler_state.SchedulerState.apply`). Events of an instance that was never
requested change nothing either (the table needs the request's machine type and region, and the
scheduler ignores such an instance too). ``instance.created`` only marks the row as updated: the
instance is still pending until its worker activates.

``free_cores_mcpu`` is the capacity the instance offers to new work as of its last instance
event: its cores while active, 0 otherwise. Instance events cannot say how much of it attempts
use (SJ and MJC live on the batch topic, and a per-instance counter written from every batch
partition would be a contended row); the scheduler keeps the live value in memory, and running
cores per pool are the tokenized ``user_inst_coll_resources`` counters.

Instance events are not fenced by epoch here: they are facts (a VM was created, a worker
activated, a VM was deleted) whoever published them, and the scheduler's fold does not fence
them either, so the projection agrees with what every scheduler replica believes.

``event_rates`` counts SJ, MJS, MJC and job cancellations per minute of the envelope's time,
tokenized by projector partition. Every applied record of those kinds counts once, duplicates
(a worker's retried MJC) included: it is a rate of events on the log, not of state changes. An
MJC that reports its attempt's start too (``start_reported`` False: the attempt ended before the
worker's MJS was due) counts as an MJS and an MJC, so MJS stays the rate of starts. The
projector applies each record exactly once, so replays give the same counts.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from core.projection.ops import Increment, InsertIgnore, Op, UpdateIn
from schemas.events import AnyEvent
from schemas.execution import (
    JobCancelled,
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
)
from schemas.infra import (
    InstanceActivated,
    InstanceCreated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceEvent,
    InstanceRequested,
    SchedulerElected,
)

RATE_KINDS: Final = {JobScheduled: "SJ", JobStarted: "MJS", JobCompleted: "MJC",
                     JobCancelled: "cancelled"}
"""The ``event_rates.kind`` of each counted event class."""
MINUTE_MS: Final = 60_000
_LIVE: Final = ("pending", "active", "inactive")
"""States an instance can leave (``deleted`` is final)."""
_REASON_LEN: Final = 100
"""``instances.reason`` is a VARCHAR(100); a driver's error message may be longer."""


def minute_of(time_ms: int) -> int:
    """The minute (since the epoch) of a time in milliseconds: ``event_rates.minute``."""
    return time_ms // MINUTE_MS


def rate_kinds(event: AnyEvent) -> tuple[str, ...]:
    """The ``event_rates`` kinds one event counts as.

    None, one, or both MJS and MJC for an MJC whose attempt's start was not reported on its own
    (``start_reported`` False).
    """
    kind = RATE_KINDS.get(type(event))
    if kind is None:
        return ()
    if isinstance(event, JobCompleted) and not event.start_reported:
        return (RATE_KINDS[JobStarted], kind)
    return (kind,)


def count_event(event: AnyEvent, time_ms: int, token: int) -> list[Increment]:
    """The ``event_rates`` increments of one applied event (none if its kind is not counted).

    Args:
        event: The event.
        time_ms: The envelope's time: the minute it counts in.
        token: The projector partition's token.

    Returns:
        One increment of ``n`` by 1 per kind of :func:`rate_kinds`; for a bunch
        (:class:`JobsScheduled`, :class:`JobsCompleted`, :class:`JobsCancelled`), by the number
        of its attempts (jobs) that count as each kind.

    """
    minute = minute_of(time_ms)
    if isinstance(event, JobsScheduled | JobsCompleted):  # a bunch counts as its attempts
        kinds = Counter(k for e in event.expand() for k in rate_kinds(e))
    elif isinstance(event, JobsCancelled):
        kinds = Counter({RATE_KINDS[JobCancelled]: len(event.job_ids)})
    else:
        kinds = Counter(rate_kinds(event))
    return [Increment("event_rates", {"minute": minute, "kind": kind, "token": token}, {"n": n})
            for kind, n in kinds.items()]


def fold_instance(event: InstanceEvent, time_ms: int) -> list[Op]:
    """The row operations of one instance event.

    Args:
        event: An ``instance.*`` event.
        time_ms: The envelope's time.

    Returns:
        Operations on ``instances`` (none for an event this projection ignores).

    """
    name = {"name": event.instance_name}
    match event:
        case InstanceRequested():
            return [InsertIgnore("instances", [{
                "name": event.instance_name, "inst_coll": event.inst_coll,
                "machine_type": event.machine_type, "region": event.region,
                "preemptible": event.preemptible, "cores_mcpu": event.cores_mcpu,
                "free_cores_mcpu": 0, "state": "pending", "for_batch_id": event.for_batch_id,
                "for_job_id": event.for_job_id, "time_created_ms": time_ms,
                "last_updated_ms": time_ms}])]
        case InstanceCreated():
            # activation may come first (a local worker is fast): created never moves the state
            return [UpdateIn("instances", {"last_updated_ms": time_ms}, name, "state", _LIVE)]
        case InstanceActivated():
            return [UpdateIn("instances", {
                "state": "active", "address": event.address, "cores_mcpu": event.cores_mcpu,
                "free_cores_mcpu": event.cores_mcpu, "time_activated_ms": time_ms,
                "time_deactivated_ms": None, "reason": None, "last_updated_ms": time_ms},
                name, "state", _LIVE)]
        case InstanceDeactivated():
            return [UpdateIn("instances", {
                "state": "inactive", "free_cores_mcpu": 0, "time_deactivated_ms": time_ms,
                "reason": event.reason[:_REASON_LEN], "last_updated_ms": time_ms},
                name, "state", _LIVE)]
        case InstanceDeleted():
            return [UpdateIn("instances", {
                "state": "deleted", "free_cores_mcpu": 0, "time_deleted_ms": time_ms,
                "reason": event.reason[:_REASON_LEN], "last_updated_ms": time_ms},
                name, "state", _LIVE)]
        case _:
            return []


def fold_election(event: SchedulerElected, time_ms: int) -> list[Op]:
    """The ``scheduler_epochs`` row of an election (a re-delivered one changes nothing).

    Args:
        event: The election.
        time_ms: The envelope's time.

    Returns:
        One insert.

    """
    return [InsertIgnore("scheduler_epochs", [{
        "epoch": event.epoch, "scheduler_id": event.scheduler_id,
        "time_elected_ms": time_ms}])]

