"""Committing an update: each job's initial state, and the counters that change, in one pass.

Cost is O(jobs + edges) of the update plus O(groups x depth) for the group tree (invariant 8):
a job's state comes from its parents' current states, never from a scan of the batch.

Rules (the seeds' state machine):
- A job is Ready when no parent is unfinished, else Pending with ``n_pending_parents``
  unfinished parents. Parents committed in the same update are unfinished by definition.
- A job that is not ``always_run`` is marked cancelled when a parent already ended in anything
  but Success, or when its group (or an ancestor group, or the batch) is cancelled. It keeps its
  Ready/Pending state; the canceller turns it Cancelled, and fair share never counts it.
- Counters: per-group job counts (recursive: a job counts in its group and every ancestor),
  ready jobs and cores per user and instance collection (tokenized), and cancellable ready
  resources per own group (so cancelling a group subtracts them in O(groups)).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.job_state import is_complete
from core.projection.ops import Increment, Increments, Update
from schemas.base import JobState

JOB_COUNTS = "job_group_job_counts"
USER_RESOURCES = "user_inst_coll_resources"
CANCELLABLE = "job_group_inst_coll_cancellable_resources"


@dataclass(frozen=True)
class CommitJob:
    """What committing needs of one job of the update."""

    job_id: int
    job_group_id: int
    inst_coll: str
    cores_mcpu: int
    always_run: bool


@dataclass(frozen=True)
class JobStart:
    """The initial state the commit gives one job."""

    job_id: int
    state: JobState
    n_pending_parents: int
    cancelled: bool


@dataclass(frozen=True)
class BatchBefore:
    """The batch as it was before the commit."""

    batch_id: int
    user: str
    n_jobs: int
    n_completed: int
    time_closed_ms: int | None


@dataclass(frozen=True)
class CommitPlan:
    """Everything a commit changes: job states, counters, batch and group rows."""

    jobs: list[JobStart]
    increments: list[Increment]
    batch: Update
    groups: list[Update]


def initial_states(
    jobs: Sequence[CommitJob],
    edges: Sequence[tuple[int, int]],
    parent_states: Mapping[int, JobState],
    cancelled_groups: frozenset[int],
) -> list[JobStart]:
    """Initial state of each job of an update.

    Args:
        jobs: the update's jobs.
        edges: (child, parent) pairs of the update's jobs.
        parent_states: current state of each parent committed in an earlier update.
        cancelled_groups: groups cancelled by themselves or through an ancestor (the root
            group 0 when the batch is cancelled).

    Returns:
        One :class:`JobStart` per job, in input order.

    """
    in_update = {j.job_id for j in jobs}
    pending: Counter[int] = Counter()
    failed_parent: set[int] = set()
    for child, parent in edges:
        if parent in in_update:
            pending[child] += 1
            continue
        state = parent_states.get(parent)
        if state is None:
            raise ValueError(f"job {child} has parent {parent}, which is not committed")
        if not is_complete(state):
            pending[child] += 1
        elif state != "Success":
            failed_parent.add(child)
    out = []
    for j in jobs:
        n = pending[j.job_id]
        cancelled = not j.always_run and (
            j.job_id in failed_parent or j.job_group_id in cancelled_groups)
        out.append(JobStart(j.job_id, "Ready" if n == 0 else "Pending", n, cancelled))
    return out


def plan_commit(
    *,
    batch: BatchBefore,
    jobs: Sequence[CommitJob],
    edges: Sequence[tuple[int, int]],
    parent_states: Mapping[int, JobState],
    cancelled_groups: frozenset[int],
    ancestors: Mapping[int, Sequence[int]],
    update_groups: Sequence[int],
    token: int,
    now_ms: int,
) -> CommitPlan:
    """Plan the commit of one update.

    Args:
        batch: the batch before the commit.
        jobs: the update's jobs.
        edges: (child, parent) pairs of those jobs.
        parent_states: current states of parents from earlier updates.
        cancelled_groups: see :func:`initial_states`.
        ancestors: for every group involved, its ancestors including itself (root last or
            anywhere: order does not matter).
        update_groups: the job groups created by this update.
        token: the writer's token for tokenized counters (its partition).
        now_ms: the commit time.

    Returns:
        The plan. The batch is complete after the commit only when it adds no jobs and every
        earlier job is complete; a new group with no jobs is complete at once.

    """
    starts = initial_states(jobs, edges, parent_states, cancelled_groups)
    acc = Increments()
    by_id = {j.job_id: j for j in jobs}
    per_group: Counter[tuple[int, str]] = Counter()
    for s in starts:
        j = by_id[s.job_id]
        per_group[(j.job_group_id, "n_ready" if s.state == "Ready" else "n_pending")] += 1
        if s.state != "Ready":
            continue
        if s.cancelled:
            acc.add(Increment(USER_RESOURCES,
                              {"user": batch.user, "inst_coll": j.inst_coll, "token": token},
                              {"n_cancelled_ready_jobs": 1}))
            continue
        acc.add(Increment(USER_RESOURCES,
                          {"user": batch.user, "inst_coll": j.inst_coll, "token": token},
                          {"n_ready_jobs": 1, "ready_cores_mcpu": j.cores_mcpu}))
        if not j.always_run:
            acc.add(Increment(CANCELLABLE,
                              {"batch_id": batch.batch_id, "job_group_id": j.job_group_id,
                               "inst_coll": j.inst_coll, "token": token},
                              {"n_ready_cancellable_jobs": 1,
                               "ready_cancellable_cores_mcpu": j.cores_mcpu}))
    running_groups: set[int] = set()
    for (group, column), n in per_group.items():
        for ancestor in ancestors[group]:
            running_groups.add(ancestor)
            acc.add(Increment(JOB_COUNTS, {"batch_id": batch.batch_id, "job_group_id": ancestor},
                              {"n_jobs": n, column: n}))
    n_jobs = batch.n_jobs + len(jobs)
    complete = n_jobs == batch.n_completed
    batch_update = Update("batches", {
        "n_jobs": n_jobs,
        "state": "complete" if complete else "running",
        "time_closed_ms": batch.time_closed_ms if batch.time_closed_ms is not None else now_ms,
        "time_completed_ms": now_ms if complete else None,
    }, {"id": batch.batch_id})
    groups = []
    touched = set(update_groups) | running_groups | ({0} if complete else set())
    for group in sorted(touched):
        done = group not in running_groups
        values: dict[str, int | str | bool | None] = {
            "state": "complete" if done else "running",
            "time_completed_ms": now_ms if done else None,
        }
        if group in update_groups:
            values["committed"] = True
        groups.append(Update("job_groups", values,
                             {"batch_id": batch.batch_id, "job_group_id": group}))
    return CommitPlan(starts, acc.drain(), batch_update, groups)
