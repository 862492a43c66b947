"""Pluggable scheduling policy in tiers, after kube-batch (pure).

Seed ``kube-batch-scheduler-framework.md`` ("Framework"): plugins are grouped in tiers, and the
framework asks them in tier order.

- **Order** (``JobOrderFn``, ``QueueOrderFn``): "first tier with a plugin function that can tell
  that two items are not equal wins"; if every plugin of every tier finds them equal, a fixed
  fallback decides (kube-batch: creation time, then UID; here the user name for queues and
  ``(batch_id, job_id)`` for jobs). With sort keys this is exactly a lexicographic comparison
  of the plugins' keys taken in tier order, which is what :meth:`Tiers.queue_key` and
  :meth:`Tiers.job_key` build.
- **Predicates** (``PredicateFn``): every predicate of every tier must pass; the first reason
  (in tier order) is the answer.

A plugin is any object with a ``name``; it takes part in a hook by returning something other
than None from it. :class:`Plugin` is a base whose hooks all say "no opinion". Plugins are
immutable snapshots (allocations, priorities) built for one scheduling round.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar

from core.priority import UserPriority

OrderKey = tuple[float | int | str, ...]
"""A sort key; smaller sorts first. One plugin's keys must be comparable with each other."""

REASON_NO_FIT: Final = "no fitting instance"
REASON_REGION: Final = "region"
REASON_FAIR_SHARE: Final = "fair share: allocation met"
REASON_NO_INSTANCES: Final = "no instances"


class SchedJob(Protocol):
    """A ready job as policies see it."""

    @property
    def batch_id(self) -> int:
        """The job's batch."""
        ...

    @property
    def job_id(self) -> int:
        """The job's id within its batch."""
        ...

    @property
    def user(self) -> str:
        """The user (the queue) the job belongs to."""
        ...

    @property
    def cores_mcpu(self) -> int:
        """The cores the job needs, in mCPU."""
        ...

    @property
    def regions(self) -> Collection[str]:
        """Regions the job may run in; empty means any."""
        ...


class SchedInstance(Protocol):
    """An instance (worker VM) as policies see it."""

    @property
    def free_cores_mcpu(self) -> int:
        """Cores not yet taken on the instance, in mCPU."""
        ...

    @property
    def region(self) -> str:
        """The instance's region."""
        ...


JobT = TypeVar("JobT", bound=SchedJob)
InstT = TypeVar("InstT", bound=SchedInstance)


class Policy(Protocol):
    """A plugin: each hook returns None when the plugin has no opinion."""

    @property
    def name(self) -> str:
        """The plugin's name, for logs and reasons."""
        ...

    def job_order(self, job: SchedJob) -> OrderKey | None:
        """Sort key of a job within its queue (smaller first), or None for no opinion."""
        ...

    def queue_order(self, user: str) -> OrderKey | None:
        """Sort key of a user's queue (smaller first), or None for no opinion."""
        ...

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """Why ``job`` may not run on ``instance``, or None if it may (or no opinion)."""
        ...


class Plugin:
    """A base :class:`Policy` whose hooks all have no opinion; override what you need."""

    name = "plugin"

    def job_order(self, job: SchedJob) -> OrderKey | None:
        """No opinion on job order."""
        return None

    def queue_order(self, user: str) -> OrderKey | None:
        """No opinion on queue order."""
        return None

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """No objection to any placement."""
        return None


_SAME: Final[OrderKey] = ()
"""Stands for "no opinion": equal for every item, so the next plugin decides."""


@dataclass(frozen=True)
class Tiers:
    """Plugins grouped in tiers; earlier tiers (and earlier plugins in a tier) decide first."""

    tiers: Sequence[Sequence[Policy]]

    def plugins(self) -> Iterable[Policy]:
        """All plugins in tier order."""
        for tier in self.tiers:
            yield from tier

    def queue_key(self, user: str) -> tuple[OrderKey, ...]:
        """Sort key of a user's queue: the plugins' keys in tier order, then the user name.

        Args:
            user: The user whose queue is ordered.

        Returns:
            A key whose comparison is decided by the first plugin that tells users apart.

        """
        keys = [_or_same(p.queue_order(user)) for p in self.plugins()]
        return (*keys, (user,))

    def job_key(self, job: SchedJob) -> tuple[OrderKey, ...]:
        """Sort key of a job: the plugins' keys in tier order, then ``(batch_id, job_id)``.

        Args:
            job: The job to order.

        Returns:
            A key whose comparison is decided by the first plugin that tells jobs apart.

        """
        keys = [_or_same(p.job_order(job)) for p in self.plugins()]
        return (*keys, (job.batch_id, job.job_id))

    def order_users(self, users: Iterable[str]) -> list[str]:
        """Users in queue order.

        Args:
            users: The users to order.

        Returns:
            The users sorted by :meth:`queue_key`.

        """
        return sorted(users, key=self.queue_key)

    def orders_jobs(self) -> bool:
        """Whether any plugin may have an opinion on job order.

        A plugin that keeps :class:`Plugin`'s ``job_order`` has none; without any opinion, jobs
        go in ``(batch_id, job_id)`` order.

        Returns:
            False only when every plugin is a :class:`Plugin` that keeps its ``job_order``.

        """
        return any(not isinstance(p, Plugin) or type(p).job_order is not Plugin.job_order
                   for p in self.plugins())

    def order_jobs(self, jobs: Iterable[JobT]) -> list[JobT]:
        """Jobs in job order.

        Args:
            jobs: The jobs to order.

        Returns:
            The jobs sorted by :meth:`job_key`.

        """
        return sorted(jobs, key=self.job_key)

    def check(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """Run every predicate in tier order; the first reason wins.

        Args:
            job: The job to place.
            instance: The candidate instance.

        Returns:
            The first plugin's reason against the placement, or None if all allow it.

        """
        for p in self.plugins():
            reason = p.predicate(job, instance)
            if reason is not None:
                return reason
        return None

    def place(self, job: SchedJob, instances: Iterable[InstT]) -> InstT | tuple[str, ...]:
        """The first instance every predicate allows, or why none does.

        Args:
            job: The job to place.
            instances: Candidates in preference order.

        Returns:
            The chosen instance, or the distinct reasons in the order first seen
            (``("no instances",)`` when there were no candidates).

        """
        reasons: dict[str, None] = {}
        for inst in instances:
            reason = self.check(job, inst)
            if reason is None:
                return inst
            reasons[reason] = None
        return tuple(reasons) or (REASON_NO_INSTANCES,)


def _or_same(key: OrderKey | None) -> OrderKey:
    return _SAME if key is None else key


class FitPlugin(Plugin):
    """Predicates: the instance is in one of the job's regions and has its cores free."""

    name = "fit"

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """``"region"`` or ``"no fitting instance"`` (region first), else None.

        Args:
            job: The job to place.
            instance: The candidate instance.

        Returns:
            The reason against the placement, or None.

        """
        if job.regions and instance.region not in job.regions:
            return REASON_REGION
        if job.cores_mcpu > instance.free_cores_mcpu:
            return REASON_NO_FIT
        return None


@dataclass(frozen=True)
class FairSharePlugin(Plugin):
    """Queues by fair-share deficit: the user furthest below their allocation goes first.

    ``deficit = allocated - scheduled`` for this round (allocations from
    :func:`core.fair_share.fair_share`). A user whose deficit is zero or less is refused
    further placements this round (Hail schedules each user's jobs until their share is met).
    """

    allocations: Mapping[str, int]
    scheduled: Mapping[str, int] = field(default_factory=dict)
    name: str = "fair-share"

    def deficit(self, user: str) -> int:
        """The mCPU the user may still start this round (negative when over).

        Args:
            user: The user.

        Returns:
            ``allocations[user] - scheduled[user]`` (missing entries count as 0).

        """
        return self.allocations.get(user, 0) - self.scheduled.get(user, 0)

    def queue_order(self, user: str) -> OrderKey | None:
        """Largest deficit first.

        Args:
            user: The user.

        Returns:
            ``(-deficit,)``.

        """
        return (-self.deficit(user),)

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """``"fair share: allocation met"`` when the job's user has no deficit left.

        Args:
            job: The job to place.
            instance: The candidate instance (unused).

        Returns:
            The reason, or None.

        """
        return REASON_FAIR_SHARE if self.deficit(job.user) <= 0 else None


@dataclass(frozen=True)
class PriorityPlugin(Plugin):
    """Queues by computed priority (highest first); users over a quota are refused.

    Users without a computed priority sort after every user with one and are not blocked.
    """

    priorities: Mapping[str, UserPriority]
    name: str = "priority"

    def queue_order(self, user: str) -> OrderKey | None:
        """Highest computed priority first.

        Args:
            user: The user.

        Returns:
            ``(-priority,)``, or ``(inf,)`` for a user without one.

        """
        p = self.priorities.get(user)
        return (math.inf,) if p is None else (-p.priority,)

    def predicate(self, job: SchedJob, instance: SchedInstance) -> str | None:
        """The quota reason (e.g. ``"quota: max active cores"``) for a blocked user.

        Args:
            job: The job to place.
            instance: The candidate instance (unused).

        Returns:
            The reason, or None.

        """
        p = self.priorities.get(job.user)
        return None if p is None else p.blocked
