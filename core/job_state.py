"""The job state machine of the seeds, as pure functions over the schema's states.

States and transitions (see the docstring of :mod:`schemas.events` for the picture)::

    Pending  -> Ready | Cancelled
    Ready    -> Creating | Running | Cancelled
    Creating -> Running | Ready | Cancelled | Error
    Running  -> Success | Failed | Error | Cancelled | Ready

``Running -> Ready`` and ``Creating -> Ready`` happen when an attempt is lost (preemption, a lost
worker) and the job has attempts left. ``Pending -> Cancelled`` happens when a parent fails and
the job is not ``always_run``, or when its batch or group is cancelled. Completed states are
final.
"""

from __future__ import annotations

from typing import Final, get_args

from schemas.base import CompletedJobState, JobState

ALL_STATES: Final[tuple[JobState, ...]] = get_args(JobState)
COMPLETED: Final[frozenset[JobState]] = frozenset(get_args(CompletedJobState))
LIVE: Final[frozenset[JobState]] = frozenset({"Ready", "Creating", "Running"})
"""States that hold (or wait for) cores: what fair share and cancellation count."""

TRANSITIONS: Final[dict[JobState, frozenset[JobState]]] = {
    "Pending": frozenset({"Ready", "Cancelled"}),
    "Ready": frozenset({"Creating", "Running", "Cancelled"}),
    "Creating": frozenset({"Running", "Ready", "Cancelled", "Error"}),
    "Running": frozenset({"Success", "Failed", "Error", "Cancelled", "Ready"}),
    "Success": frozenset(),
    "Failed": frozenset(),
    "Error": frozenset(),
    "Cancelled": frozenset(),
}


class IllegalTransition(ValueError):
    """A job was asked to move along an edge the state machine does not have."""


def is_complete(state: JobState) -> bool:
    """Whether ``state`` is final."""
    return state in COMPLETED


def can_transition(source: JobState, target: JobState) -> bool:
    """Whether a job in ``source`` may move to ``target``."""
    return target in TRANSITIONS[source]


def transition(source: JobState, target: JobState) -> JobState:
    """Move from ``source`` to ``target``, or raise :class:`IllegalTransition`."""
    if not can_transition(source, target):
        raise IllegalTransition(f"a job cannot go from {source} to {target}")
    return target


def initial_state(n_unfinished_parents: int) -> JobState:
    """A job's state at commit: Ready with no unfinished parents, else Pending."""
    if n_unfinished_parents < 0:
        raise ValueError("a job cannot have a negative number of unfinished parents")
    return "Ready" if n_unfinished_parents == 0 else "Pending"


def counts_as_failed(state: JobState) -> bool:
    """Whether ``state`` makes a batch's state ``failure`` (Failed and Error both do)."""
    return state in ("Failed", "Error")
