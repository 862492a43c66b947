"""One pure scheduling step and the cancellers' picks, over a :class:`SchedulerState`.

No function here changes the state: they return events (and kills) for the caller to publish;
the state learns of them when it folds them back from the log. The attempt ids are injected, so
a step is deterministic given the state, the tiers and the id generator.

A step, per instance collection (in name order):

1. fair share (:func:`core.fair_share.fair_share`) splits the free cores of the collection's
   active instances across the users with ready jobs, from their ready and running cores;
2. users are taken in the order of the caller's tiers, then fair-share deficit, then name
   (:meth:`core.policy.Tiers.order_users`), with a last tier of
   :class:`~core.policy.FairSharePlugin` and :class:`~core.policy.FitPlugin` appended;
3. each user's queue head (in (batch, job) order, at most the remaining ``max_jobs``) is
   re-ordered by the tiers' job order and placed first-fit on the active instances in name
   order. Free cores are tracked within the step, so an instance is never over-allocated.

A job that failed a user-level predicate (quota, fair share, no instances) ends its user's turn
in that collection; a job that found no fitting instance or region lets the next job try
(backfill). A job needing more cores than the largest worker of its collection is reported
permanently unschedulable instead (``max_worker_mcpu``).

Every queue left with fewer placements than ready jobs gets a waiting reason
(:mod:`core.waiting`), from what the step saw anyway: the reason that ended the user's turn,
else the first reason of a job of its own; the first few such jobs get their own entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Final, NamedTuple

from core.fair_share import UserDemand, fair_share
from core.policy import REASON_NO_FIT, REASON_REGION, FairSharePlugin, FitPlugin, Tiers
from core.scheduler_state import READY, RUNNING, SchedulerState
from core.waiting import (
    MAX_JOBS_PER_QUEUE,
    Waiting,
    WaitingKey,
    capacity_note,
    classify,
    full,
    queued,
)
from schemas.base import CancelReason
from schemas.batch import BatchCancelled, JobGroupCancelled
from schemas.execution import (
    JobsCancelled,
    JobScheduled,
    JobsScheduled,
    JobUnschedulable,
)

CANCEL_SHARE_TOTAL: Final = 300
"""The seed's canceller: jobs to cancel per iteration, shared across users."""

CANCEL_MIN_PER_USER: Final = 20
"""The seed's canceller: every user with cancellable jobs gets at least this many."""

SJ_BUNCH_MAX: Final = 1_000
"""The most attempts one :class:`JobsScheduled` carries (about 300 kB with their resources,
under a broker's usual 1 MB record limit)."""

_PER_JOB_REASONS: Final = frozenset({REASON_NO_FIT, REASON_REGION})
"""Reasons that depend on the job (a later, smaller job may still fit)."""


@dataclass(frozen=True, slots=True)
class ReadyJob:
    """A ready job as the policies see it (:class:`core.policy.SchedJob`)."""

    batch_id: int
    job_id: int
    user: str
    inst_coll: str
    cores_mcpu: int
    regions: tuple[str, ...]


@dataclass(slots=True)
class Slot:
    """An active instance with the cores still free in this step (:class:`SchedInstance`)."""

    name: str
    region: str
    free_cores_mcpu: int


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A job examined in this step but not placed, and every reason seen."""

    batch_id: int
    job_id: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Decisions:
    """What one step decided. Nothing is applied to the state yet."""

    scheduled: list[JobScheduled] = field(default_factory=list)
    unplaced: list[Unplaced] = field(default_factory=list)
    unschedulable: list[JobUnschedulable] = field(default_factory=list)
    """Permanent: the job needs more cores than any worker of its collection has."""
    allocations: dict[str, dict[str, int]] = field(default_factory=dict)
    """Fair-share mCPU per inst_coll and user."""
    waiting: dict[WaitingKey, Waiting] = field(default_factory=dict)
    """Why queues (and their first few blocked jobs) got fewer placements than ready jobs."""


def schedule(
    state: SchedulerState,
    tiers: Tiers,
    *,
    max_jobs: int,
    new_attempt_id: Callable[[], str],
    max_worker_mcpu: Mapping[str, int] | None = None,
    max_instances: Mapping[str, int] | None = None,
) -> Decisions:
    """Place ready jobs on active instances, fairly, without over-allocating any instance.

    Args:
        state: The folded state (not changed).
        tiers: The caller's policy tiers (priorities, quotas, ...). Fair share and fit are
            always enforced, by a last tier this function appends.
        max_jobs: At most this many jobs are examined (placed or given a reason) in the step.
        new_attempt_id: Returns a fresh attempt id for each placement.
        max_worker_mcpu: The cores of the largest worker per inst_coll; a job needing more is
            permanently unschedulable. Collections not named are not checked.
        max_instances: The maximum number of instances per inst_coll, only to tell waiting
            jobs whether more instances may come (:func:`core.waiting.capacity_note`).

    Returns:
        The SJ events to publish, the reasons for unplaced jobs, the permanently
        unschedulable jobs, the fair-share allocations and the waiting reasons: one for every
        (user, inst_coll) queue with fewer placements and unschedulable jobs than ready jobs
        (and none for any other), plus one for each of the first
        :data:`~core.waiting.MAX_JOBS_PER_QUEUE` jobs of a queue left unplaced for a reason of
        their own (region, fit).

    """
    out = Decisions()
    limits = max_worker_mcpu or {}
    users_by_coll: dict[str, list[str]] = {}
    for (user, inst_coll), queue in state.ready.items():
        if len(queue):
            users_by_coll.setdefault(inst_coll, []).append(user)
    n_instances: dict[str, int] = {}
    for inst in state.instances.values() if max_instances else ():
        n_instances[inst.inst_coll] = n_instances.get(inst.inst_coll, 0) + 1
    budget = max_jobs
    for inst_coll in sorted(users_by_coll):
        users = users_by_coll[inst_coll]
        if budget <= 0:  # not reached this step: every queue waits its turn
            out.waiting.update((WaitingKey(u, inst_coll), queued(max_jobs)) for u in users)
            continue
        cap = (max_instances or {}).get(inst_coll)
        note = capacity_note(cap if cap is not None and n_instances.get(inst_coll, 0) >= cap
                             else None)
        slots = [Slot(name, inst.region, inst.free_mcpu)
                 for name, inst in sorted(state.instances.items())
                 if inst.active and inst.inst_coll == inst_coll and inst.free_mcpu > 0]
        demands = {u: UserDemand(state.ready_mcpu.get((u, inst_coll), 0),
                                 state.running_mcpu.get((u, inst_coll), 0)) for u in users}
        allocations = fair_share(sum(s.free_cores_mcpu for s in slots), demands)
        out.allocations[inst_coll] = allocations
        taken: dict[str, int] = {}
        step_tiers = Tiers([*tiers.tiers, [FairSharePlugin(allocations, taken), FitPlugin()]])
        had_slots = bool(slots)
        for user in step_tiers.order_users(users):
            queue = state.ready[(user, inst_coll)]
            if budget <= 0 or (had_slots and not slots):  # the user's turn never came
                out.waiting[WaitingKey(user, inst_coll)] = (
                    queued(max_jobs) if budget <= 0 else full(inst_coll, note))
                continue
            # Why the user's turn ended early (out of budget, every instance full, a user-level
            # predicate), and the first reason of a job of its own.
            stop: Waiting | None = None
            first: Waiting | None = None
            handled = job_entries = 0
            head: Iterable[ReadyJob]
            if step_tiers.orders_jobs():
                ordered = step_tiers.order_jobs(
                    [_view(state, user, inst_coll, b, j) for b, j in islice(queue, budget)])
                head, n_head = ordered, len(ordered)
            else:  # the queue's (batch, job) order is the job order: views made as needed
                head = (_view(state, user, inst_coll, b, j) for b, j in islice(queue, budget))
                n_head = min(budget, len(queue))
            for job in head:
                if budget <= 0:
                    stop = queued(max_jobs)
                    break
                if had_slots and not slots:
                    stop = full(inst_coll, note)
                    break
                budget -= 1
                limit = limits.get(inst_coll)
                if limit is not None and job.cores_mcpu > limit:
                    handled += 1
                    out.unschedulable.append(JobUnschedulable(
                        batch_id=job.batch_id, job_id=job.job_id, permanent=True,
                        reason=f"needs {job.cores_mcpu} mCPU; the largest {inst_coll} worker "
                               f"has {limit} mCPU"))
                    continue
                placed = step_tiers.place(job, slots)
                if isinstance(placed, Slot):
                    placed.free_cores_mcpu -= job.cores_mcpu
                    if placed.free_cores_mcpu <= 0:  # full: no later job needs to ask it
                        slots.remove(placed)
                    taken[user] = taken.get(user, 0) + job.cores_mcpu
                    handled += 1
                    out.scheduled.append(JobScheduled(
                        batch_id=job.batch_id, job_id=job.job_id, attempt_id=new_attempt_id(),
                        instance_name=placed.name, inst_coll=inst_coll,
                        cores_mcpu=job.cores_mcpu))
                    continue
                out.unplaced.append(Unplaced(job.batch_id, job.job_id, placed))
                if not _PER_JOB_REASONS.intersection(placed):
                    stop = classify(placed, inst_coll=inst_coll, cores_mcpu=job.cores_mcpu,
                                    regions=job.regions, note=note)
                    break  # quota, fair share or no instances: the user's turn is over
                if job_entries < MAX_JOBS_PER_QUEUE:  # a bounded number of jobs say why
                    job_entries += 1
                    why = classify(placed, inst_coll=inst_coll, cores_mcpu=job.cores_mcpu,
                                   regions=job.regions, note=note)
                    first = first or why
                    out.waiting[WaitingKey(user, inst_coll, job.batch_id, job.job_id)] = why
            if stop is None and n_head < len(queue):
                stop = queued(max_jobs)  # the rest of the queue was past the step's budget
            if handled < len(queue):
                out.waiting[WaitingKey(user, inst_coll)] = stop or first or queued(max_jobs)
    return out


def _view(state: SchedulerState, user: str, inst_coll: str, batch_id: int, job_id: int
          ) -> ReadyJob:
    job = state.batches[batch_id].jobs[job_id]
    return ReadyJob(batch_id, job_id, user, inst_coll, job.cores_mcpu, job.regions or ())


class Kill(NamedTuple):
    """A running attempt of a cancelled job that its worker must stop."""

    batch_id: int
    job_id: int
    attempt_id: str
    instance_name: str


@dataclass(frozen=True)
class Cancellations:
    """The canceller's pick: bunches of events for Ready jobs, kills for Running ones."""

    cancelled: list[JobsCancelled] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)


def bunches(scheduled: Iterable[JobScheduled], max_attempts: int = SJ_BUNCH_MAX
            ) -> list[JobsScheduled]:
    """A step's SJs as bunches: one per batch (in first-placement order) and ``max_attempts``.

    Expanding the bunches of a batch gives back its SJs in their order, so the log says what the
    single SJs would have said, in fewer records.
    """
    by_batch: dict[int, list[JobScheduled]] = {}
    for sj in scheduled:
        by_batch.setdefault(sj.batch_id, []).append(sj)
    return [JobsScheduled.of(b, sjs[i:i + max_attempts])
            for b, sjs in by_batch.items() for i in range(0, len(sjs), max_attempts)]


def cancel_shares(counts: Mapping[str, int], total: int = CANCEL_SHARE_TOTAL,
                  minimum: int = CANCEL_MIN_PER_USER) -> dict[str, int]:
    """Each user's share of ``total`` cancellations, proportional to their cancellable jobs.

    Args:
        counts: Cancellable jobs per user.
        total: Cancellations per iteration to share out (the seed's 300).
        minimum: Every user with cancellable jobs gets at least this many (the seed's 20).

    Returns:
        ``max(minimum, round_half_up(total * n / sum))`` per user with ``n > 0``.

    """
    positive = {u: n for u, n in counts.items() if n > 0}
    whole = sum(positive.values())
    return {u: max(minimum, (2 * total * n + whole) // (2 * whole)) for u, n in positive.items()}


def cancellations(state: SchedulerState, max_jobs: int = CANCEL_SHARE_TOTAL, *,
                  min_per_user: int = CANCEL_MIN_PER_USER) -> Cancellations:
    """Pick effectively cancelled Ready and Running jobs to cancel, fairly across users.

    Each user's share (:func:`cancel_shares`) is taken from the head of their cancel queue in
    (batch, job) order. A Running job's kill is repeated on every call until its worker reports
    the attempt's end; kills are idempotent by attempt.

    Args:
        state: The folded state (not changed).
        max_jobs: Cancellations per iteration to share out.
        min_per_user: The least any user with cancellable jobs gets.

    Returns:
        For Ready jobs, ``jobs.cancelled`` bunches: one per batch and reason, of that batch's
        picked jobs in pick order (the users in name order, as their shares are taken); kills
        for Running ones.

    """
    out = Cancellations()
    counts = {user: len(queue) for user, queue in state.to_cancel.items()}
    picked: dict[tuple[int, CancelReason], list[int]] = {}
    for user, share in sorted(cancel_shares(counts, max_jobs, min_per_user).items()):
        for batch_id, job_id in islice(state.to_cancel[user], share):
            job = state.batches[batch_id].jobs[job_id]
            if job.state == READY:
                picked.setdefault((batch_id, job.cancel or "user"), []).append(job_id)
            elif job.state == RUNNING and job.attempt_id is not None and job.instance:
                out.kills.append(Kill(batch_id, job_id, job.attempt_id, job.instance))
    out.cancelled.extend(JobsCancelled(batch_id=b, job_ids=ids, reason=reason)
                         for (b, reason), ids in picked.items())
    return out


def failure_cancellations(state: SchedulerState) -> list[BatchCancelled | JobGroupCancelled]:
    """Cancel the batches and job groups that reached ``cancel_after_n_failures``.

    The entries stay in ``state.failure_cancels`` until the cancellations are folded, so the
    events are repeated on every call until then; folding them twice changes nothing.

    Args:
        state: The folded state (not changed).

    Returns:
        ``batch.cancelled`` for a batch (group 0), ``job_group.cancelled`` for another group,
        with reason ``n_failures``, in (batch id, group id) order.

    """
    return [BatchCancelled(batch_id=b, reason="n_failures") if g == 0 else
            JobGroupCancelled(batch_id=b, job_group_id=g, reason="n_failures")
            for b, g in sorted(state.failure_cancels)]
