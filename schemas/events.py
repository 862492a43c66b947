"""The event catalog: one tagged union of every event in the system.

Job states (the seeds' state diagram)::

    Pending ──(last parent ended)──► Ready ──SJ──► Running ──MJC──► Success | Failed | Error
                                       │  └─(job-private)─► Creating ──SJ──┘        │
                                       │                       │                   │
                                       └──────────── cancelled ┴──► Cancelled ◄────┘
    Running ──attempt.lost──► Ready (a new attempt), or Error after n_max_attempts

- A job's initial state at commit comes from its parents' current states: Ready if none is
  unfinished, else Pending with n_pending_parents unfinished parents. A job with no parents is
  Ready.
- When a parent ends in anything but Success, a child that is not ``always_run`` is Cancelled
  (reason ``parent_failed``) once it would otherwise become Ready. ``always_run`` jobs run anyway.
- Cancelling a batch or job group stops new scheduling at once; Ready, Creating and Running jobs
  that are not ``always_run`` end Cancelled. ``always_run`` jobs still run.
- The first MJC of an attempt decides a Running job's state; later duplicates are no-ops. MJS of
  an attempt of a completed job is a no-op (MJC may overtake MJS).

Batch and job-group states::

    open ──update.committed──► running ──last job ended──► complete (success|failure|cancelled)
                                  ▲                            │
                                  └──── a later update commits ┘

The API's ``state`` is ``open`` until the first commit, then ``failure`` as soon as any job
failed, else ``cancelled`` if cancelled, else ``success`` once complete, else ``running``. A
batch with no jobs is complete with state ``success``. A cancelled batch accepts no new updates.

Requests and facts are different events: ``batch.cancel_requested`` is what a user asked for,
``batch.cancelled`` is what happened. Tags are stable forever; events only gain fields with
defaults; a breaking change is a new tag plus an upcaster (see ``schemas.upcast``).
"""

from __future__ import annotations

from typing import TypeAlias

from schemas.base import Event
from schemas.batch import (
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupCancelRequested,
    JobGroupCompleted,
    JobGroupsSubmitted,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.control import (
    BillingLimitSet,
    BillingProjectClosed,
    BillingProjectCreated,
    BillingProjectDeleted,
    BillingProjectMemberAdded,
    BillingProjectMemberRemoved,
    BillingProjectReopened,
    ResourceRateSet,
    ServiceFreezeSet,
    TokenIssued,
    TokenRevoked,
    UserCreated,
    UserDeleted,
    WaitingReasonsChanged,
)
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
    JobUnschedulable,
)
from schemas.infra import (
    InstanceActivated,
    InstanceCreated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceRequested,
    LogMarker,
    SchedulerElected,
)

AnyEvent: TypeAlias = (
    UserCreated
    | UserDeleted
    | TokenIssued
    | TokenRevoked
    | BillingProjectCreated
    | BillingProjectClosed
    | BillingProjectReopened
    | BillingProjectDeleted
    | BillingProjectMemberAdded
    | BillingProjectMemberRemoved
    | BillingLimitSet
    | ResourceRateSet
    | ServiceFreezeSet
    | BatchCreated
    | UpdateOpened
    | JobGroupsSubmitted
    | JobsSubmitted
    | UpdateCommitted
    | BatchCancelRequested
    | BatchCancelled
    | JobGroupCancelRequested
    | JobGroupCancelled
    | BatchDeleted
    | BatchCompleted
    | JobGroupCompleted
    | JobScheduled
    | JobsScheduled
    | JobStarted
    | JobCompleted
    | JobsCompleted
    | AttemptHeartbeat
    | AttemptLost
    | JobCancelled
    | JobUnschedulable
    | SchedulerElected
    | InstanceRequested
    | InstanceCreated
    | InstanceActivated
    | InstanceDeactivated
    | InstanceDeleted
    | LogMarker
    | WaitingReasonsChanged
    | JobsCancelled
)
"""Every event of the system."""

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
"""The classes of the union, in catalog order."""


def tag_of(cls: type[Event]) -> str:
    """The stable tag of an event class."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str), f"{cls.__name__} has no explicit string tag"
    return tag


EVENTS_BY_TAG: dict[str, type[Event]] = {tag_of(cls): cls for cls in EVENT_TYPES}
"""Event class by tag."""

CURRENT_VERSIONS: dict[str, int] = {tag: cls.version for tag, cls in EVENTS_BY_TAG.items()}
"""The current schema version of each tag."""
