"""Execution events as counter movements: a job changing state moves its counters.

Every job state change is ``leave(old) + enter(new)`` over three kinds of counters:

- per-group job counts, for the job's group and every ancestor (n_pending, n_ready,
  n_creating, n_running; n_completed and its outcome column when the job ends; Error counts in
  n_failed and n_errored, as the reference reports it);
- the user's tokenized fair-share row: ready/running jobs and cores and creating jobs, or the
  ``n_cancelled_*`` columns for a job that is cancelled but not yet drained;
- the own group's tokenized cancellable resources, for live jobs that are not always_run and
  not cancelled.

A job is *effectively cancelled* when it is not always_run and either its ``cancelled`` flag is
set (a failed parent) or its group (or an ancestor) is cancelled. The cancel plan moved such
jobs' counters already; every later movement keeps them in the cancelled columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from core.projection.counters import CANCELLABLE, JOB_COUNTS, USER_RESOURCES
from core.projection.ops import Increment, Increments, Row
from schemas.base import JobState

_LIVE_COUNT = {"Pending": "n_pending", "Ready": "n_ready", "Creating": "n_creating",
               "Running": "n_running"}
_OUTCOME_COUNT = {"Success": ("n_succeeded",), "Failed": ("n_failed",),
                  "Error": ("n_failed", "n_errored"), "Cancelled": ("n_cancelled",)}


@dataclass(frozen=True)
class JobFacts:
    """What counter movements need to know of a job."""

    batch_id: int
    job_id: int
    job_group_id: int
    user: str
    inst_coll: str
    cores_mcpu: int
    always_run: bool
    cancelled: bool
    """Effectively cancelled (see the module docstring)."""


def _counts(job: JobFacts, state: JobState, sign: int, ancestors: Sequence[int]
            ) -> list[Increment]:
    if state in _LIVE_COUNT:
        deltas = {_LIVE_COUNT[state]: sign}
    else:
        deltas = {"n_completed": sign, **{c: sign for c in _OUTCOME_COUNT[state]}}
    return [Increment(JOB_COUNTS, {"batch_id": job.batch_id, "job_group_id": g}, deltas)
            for g in ancestors]


def _resources(job: JobFacts, state: JobState, sign: int, token: int) -> list[Increment]:
    if state not in ("Ready", "Running", "Creating"):
        return []
    key: Row = {"user": job.user, "inst_coll": job.inst_coll, "token": token}
    s = state.lower()
    if job.cancelled:
        return [Increment(USER_RESOURCES, key, {f"n_cancelled_{s}_jobs": sign})]
    deltas = {f"n_{s}_jobs": sign}
    if state != "Creating":
        deltas[f"{s}_cores_mcpu"] = sign * job.cores_mcpu
    out = [Increment(USER_RESOURCES, key, deltas)]
    if not job.always_run:
        cdeltas = {f"n_{s}_cancellable_jobs": sign}
        if state != "Creating":
            cdeltas[f"{s}_cancellable_cores_mcpu"] = sign * job.cores_mcpu
        out.append(Increment(CANCELLABLE, {"batch_id": job.batch_id,
                                           "job_group_id": job.job_group_id,
                                           "inst_coll": job.inst_coll, "token": token},
                             cdeltas))
    return out


def move(job: JobFacts, old: JobState, new: JobState, ancestors: Sequence[int], token: int
         ) -> list[Increment]:
    """The counter increments of ``job`` going from ``old`` to ``new``."""
    if old == new:
        return []
    return (_counts(job, old, -1, ancestors) + _resources(job, old, -1, token)
            + _counts(job, new, +1, ancestors) + _resources(job, new, +1, token))


def move_into(acc: Increments, job: JobFacts, old: JobState, new: JobState,
              ancestors: Sequence[int], token: int, times: int = 1) -> None:
    """Add to ``acc`` what :func:`move` returns, without an :class:`Increment` per row.

    The live projector moves every job twice (Ready to Running, Running to its end), some
    six rows each; built as ops and merged one by one, that was a tenth of its CPU per no-op
    job. Drained, ``acc`` holds exactly ``merge_increments`` of what :func:`move` returns
    (tests/core/test_projection_execution.py checks it on random moves).
    """
    if old == new:
        return
    bump = acc.bump
    for state, sign in ((old, -times), (new, times)):
        live = _LIVE_COUNT.get(state)
        columns = (live,) if live is not None else ("n_completed", *_OUTCOME_COUNT[state])
        for g in ancestors:
            key = (("batch_id", job.batch_id), ("job_group_id", g))
            for column in columns:
                bump(JOB_COUNTS, key, column, sign)
        if state not in ("Ready", "Running", "Creating"):
            continue
        lower = state.lower()
        user = (("user", job.user), ("inst_coll", job.inst_coll), ("token", token))
        if job.cancelled:
            bump(USER_RESOURCES, user, f"n_cancelled_{lower}_jobs", sign)
            continue
        cores = state != "Creating"
        bump(USER_RESOURCES, user, f"n_{lower}_jobs", sign)
        if cores:
            bump(USER_RESOURCES, user, f"{lower}_cores_mcpu", sign * job.cores_mcpu)
        if not job.always_run:
            group = (("batch_id", job.batch_id), ("job_group_id", job.job_group_id),
                     ("inst_coll", job.inst_coll), ("token", token))
            bump(CANCELLABLE, group, f"n_{lower}_cancellable_jobs", sign)
            if cores:
                bump(CANCELLABLE, group, f"{lower}_cancellable_cores_mcpu",
                     sign * job.cores_mcpu)


# (batch, group, user, instance collection, cores, always_run, cancelled, old, new, ancestors,
# token): what a movement's increments depend on (not the job's id)
_Movement = tuple[int, int, str, str, int, bool, bool, JobState, JobState, tuple[int, ...], int]


@dataclass
class Moves:
    """Job movements counted by what their increments depend on, then made increments at once.

    A movement's increments are plus or minus one (or the job's cores) on some six to ten
    counter rows, the same for every job of a batch that has the same group, resources and
    flags: the live projector moves every job twice (to Running, then to its end), and the
    jobs of a bunch mostly move alike. Counting them first spares each movement its row
    updates. Drained, ``acc`` holds exactly what :func:`move_into` of each movement would add
    (tests/core/test_projection_execution.py).
    """

    _n: dict[_Movement, int] = field(default_factory=dict)

    def add(self, job: JobFacts, old: JobState, new: JobState, ancestors: Sequence[int],
            token: int) -> None:
        """Move ``job`` from ``old`` to ``new`` (nothing if they are the same)."""
        if old == new:
            return
        key = (job.batch_id, job.job_group_id, job.user, job.inst_coll, job.cores_mcpu,
               job.always_run, job.cancelled, old, new, tuple(ancestors), token)
        n = self._n
        n[key] = n.get(key, 0) + 1

    def drain_into(self, acc: Increments) -> None:
        """Add the increments of every movement counted to ``acc``; then empty."""
        for (b, g, user, inst_coll, cores, always_run, cancelled, old, new, ancestors,
             token), times in self._n.items():
            move_into(acc, JobFacts(b, 0, g, user, inst_coll, cores, always_run, cancelled),
                      old, new, ancestors, token, times)
        self._n.clear()


@dataclass(frozen=True)
class Child:
    """A committed child of a job that just ended."""

    facts: JobFacts
    state: JobState
    n_pending_parents: int


@dataclass(frozen=True)
class Release:
    """What happens to one child when a parent ends."""

    job_id: int
    n_pending_parents: int
    state: JobState
    cancelled_flag: bool
    """Whether the child's own ``cancelled`` flag is now set (a parent failed)."""


def release_children(parent_state: JobState, children: Sequence[Child],
                     ancestors_of: Mapping[int, Sequence[int]], token: int
                     ) -> tuple[list[Release], list[Increment]]:
    """Children of a job that ended in ``parent_state``: one pending parent fewer each.

    A child with no pending parent left becomes Ready. When the parent did not succeed, a child
    that is not always_run gets its cancelled flag (it will be drained, never run).

    Args:
        parent_state: the final state of the parent.
        children: its committed children that are still Pending.
        ancestors_of: ancestors (with itself) of each child's group.
        token: the writer's token.

    Returns:
        The new rows of the children and the counter increments.

    """
    releases: list[Release] = []
    incs: list[Increment] = []
    failed = parent_state != "Success"
    for c in children:
        if c.state != "Pending":
            continue
        flag = failed and not c.facts.always_run
        pending = max(0, c.n_pending_parents - 1)
        new_state: JobState = "Ready" if pending == 0 else "Pending"
        facts = replace(c.facts, cancelled=c.facts.cancelled or flag)
        releases.append(Release(c.facts.job_id, pending, new_state, flag))
        incs += move(facts, "Pending", new_state, ancestors_of[c.facts.job_group_id], token)
    return releases, incs
