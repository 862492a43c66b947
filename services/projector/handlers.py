"""Per-event handling: load the little state an event needs, call the pure core, emit ops.

SQL here only *reads*; every write is an operation applied by the writer. Reads flush the
writer first, so they see the effects of earlier events of the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from core.projection.cancel import Cancellable, plan_cancel
from core.projection.commit import BatchBefore, CommitJob, plan_commit
from core.projection.fold import (
    fold_batch_created,
    fold_batch_deleted,
    fold_control,
    fold_job_groups,
    fold_jobs,
    fold_update_opened,
)
from core.projection.ops import Update, UpdateIn
from schemas.base import CancelReason, JobState
from schemas.batch import (
    BatchCancelled,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupsSubmitted,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.control import ControlEvent
from schemas.envelope import Envelope
from services.projector.writer import Writer


def _t(sql: str, *expanding: str) -> sa.TextClause:
    stmt = sa.text(sql)
    return stmt.bindparams(*(sa.bindparam(e, expanding=True) for e in expanding))


_ANCESTRY = _t("SELECT job_group_id, ancestor_id, level FROM job_group_self_and_ancestors "
               "WHERE batch_id = :b AND job_group_id IN :groups", "groups")
_UPDATE = sa.text("SELECT committed FROM batch_updates WHERE batch_id = :b AND update_id = :u")
_BATCH = sa.text(
    "SELECT b.user, b.n_jobs, b.time_closed_ms, c.n_completed FROM batches b "
    "JOIN job_group_job_counts c ON c.batch_id = b.id AND c.job_group_id = 0 WHERE b.id = :b")
_UPDATE_JOBS = sa.text(
    "SELECT job_id, job_group_id, inst_coll, cores_mcpu, always_run FROM jobs "
    "WHERE batch_id = :b AND update_id = :u")
_UPDATE_EDGES = sa.text(
    "SELECT jp.job_id, jp.parent_id, p.state, p.update_id FROM jobs c "
    "JOIN job_parents jp ON jp.batch_id = c.batch_id AND jp.job_id = c.job_id "
    "JOIN jobs p ON p.batch_id = jp.batch_id AND p.job_id = jp.parent_id "
    "WHERE c.batch_id = :b AND c.update_id = :u")
_UPDATE_GROUPS = sa.text(
    "SELECT job_group_id FROM job_groups WHERE batch_id = :b AND update_id = :u")
_CANCELLED = sa.text("SELECT job_group_id FROM job_groups_cancelled WHERE batch_id = :b")
_DESCENDANTS = sa.text("SELECT job_group_id FROM job_group_self_and_ancestors "
                       "WHERE batch_id = :b AND ancestor_id = :g")
_CANCELLABLE = _t(
    "SELECT job_group_id, inst_coll, SUM(n_ready_cancellable_jobs), "
    "SUM(ready_cancellable_cores_mcpu), SUM(n_running_cancellable_jobs), "
    "SUM(running_cancellable_cores_mcpu), SUM(n_creating_cancellable_jobs) "
    "FROM job_group_inst_coll_cancellable_resources "
    "WHERE batch_id = :b AND job_group_id IN :groups GROUP BY job_group_id, inst_coll", "groups")
_OWNER = sa.text("SELECT user FROM batches WHERE id = :b")


class Handler:
    """Folds envelopes into operations on one connection, for one partition's token."""

    def __init__(self, conn: sa.Connection, writer: Writer, token: int) -> None:
        self._conn = conn
        self._w = writer
        self._token = token

    def _read(self, stmt: sa.TextClause, **params: object) -> Sequence[Any]:
        self._w.flush()
        return self._conn.execute(stmt, params).all()

    def handle(self, env: Envelope) -> bool:
        """Fold one envelope; False if its tag has no projection (yet)."""
        event, now = env.event, env.time_ms
        match event:
            case ControlEvent():
                self._w.emit(fold_control(event, now))
            case BatchCreated():
                self._w.emit(fold_batch_created(event, now))
            case UpdateOpened():
                self._w.emit(fold_update_opened(event, now))
            case JobGroupsSubmitted():
                self._job_groups(event, now)
            case JobsSubmitted():
                self._w.emit(fold_jobs(event))
            case UpdateCommitted():
                self._commit(event, now)
            case BatchCancelled():
                self._cancel(event.batch_id, 0, event.reason, now)
            case JobGroupCancelled():
                self._cancel(event.batch_id, event.job_group_id, event.reason, now)
            case BatchDeleted():
                self._w.emit(fold_batch_deleted(event, now))
            case _:
                return False
        return True

    def _job_groups(self, event: JobGroupsSubmitted, now: int) -> None:
        inside = {g.job_group_id for g in event.job_groups}
        outside = sorted({g.parent_id for g in event.job_groups} - inside)
        ancestry: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for group, ancestor, level in self._read(_ANCESTRY, b=event.batch_id, groups=outside):
            ancestry[int(group)].append((int(ancestor), int(level)))
        missing = [p for p in outside if p not in ancestry]
        if missing:  # ingest validated the parents; a gap here is a bug upstream
            raise LookupError(f"batch {event.batch_id}: parent groups {missing} do not exist")
        self._w.emit(fold_job_groups(event, now, ancestry))

    def _commit(self, event: UpdateCommitted, now: int) -> None:
        b, u = event.batch_id, event.update_id
        update = self._read(_UPDATE, b=b, u=u)
        if not update or update[0][0]:
            return  # unknown (ingest validates) or already committed: a duplicate request
        (user, n_jobs, time_closed, n_completed), = self._read(_BATCH, b=b)
        jobs = [CommitJob(int(j), int(g), str(ic), int(c), bool(a))
                for j, g, ic, c, a in self._read(_UPDATE_JOBS, b=b, u=u)]
        edges: list[tuple[int, int]] = []
        parent_states: dict[int, JobState] = {}
        for child, parent, state, parent_update in self._read(_UPDATE_EDGES, b=b, u=u):
            edges.append((int(child), int(parent)))
            if parent_update != u:
                parent_states[int(parent)] = state
        update_groups = [int(g) for (g,) in self._read(_UPDATE_GROUPS, b=b, u=u)]
        cancelled = self._cancelled_groups(b)
        involved = sorted({j.job_group_id for j in jobs} | set(update_groups))
        ancestors: dict[int, list[int]] = defaultdict(list)
        for group, ancestor, _ in self._read(_ANCESTRY, b=b, groups=involved or [0]):
            ancestors[int(group)].append(int(ancestor))
        plan = plan_commit(
            batch=BatchBefore(b, str(user), int(n_jobs), int(n_completed),
                              None if time_closed is None else int(time_closed)),
            jobs=jobs, edges=edges, parent_states=parent_states,
            cancelled_groups=cancelled, ancestors=ancestors, update_groups=update_groups,
            token=self._token, now_ms=now)
        by_values: dict[tuple[JobState, int, bool], list[int]] = defaultdict(list)
        for s in plan.jobs:
            by_values[(s.state, s.n_pending_parents, s.cancelled)].append(s.job_id)
        for (state, n_pending, is_cancelled), ids in sorted(by_values.items()):
            self._w.emit([UpdateIn("jobs", {
                "state": state, "n_pending_parents": n_pending, "cancelled": is_cancelled,
                "cancel_reason": "parent_failed" if is_cancelled else None, "committed": True,
            }, {"batch_id": b}, "job_id", ids)])
        self._w.emit(plan.increments)
        self._w.emit([plan.batch, *plan.groups, Update(
            "batch_updates", {"committed": True, "time_committed_ms": now},
            {"batch_id": b, "update_id": u})])

    def _cancelled_groups(self, batch_id: int) -> frozenset[int]:
        """Groups cancelled directly or through an ancestor (rows exist for descendants)."""
        return frozenset(int(g) for (g,) in self._read(_CANCELLED, b=batch_id))

    def _cancel(self, batch_id: int, group: int, reason: CancelReason, now: int) -> None:
        owner = self._read(_OWNER, b=batch_id)
        if not owner:
            raise LookupError(f"cancel of unknown batch {batch_id}")
        done = self._cancelled_groups(batch_id)
        groups = sorted({int(g) for (g,) in self._read(_DESCENDANTS, b=batch_id, g=group)}
                        - done)
        rows = self._read(_CANCELLABLE, b=batch_id, groups=groups) if groups else []
        cancellable = [Cancellable(int(g), str(ic), *(int(v or 0) for v in vals))
                       for g, ic, *vals in rows]
        self._w.emit(plan_cancel(batch_id=batch_id, user=str(owner[0][0]), groups=groups,
                                 cancellable=cancellable, reason=reason, token=self._token,
                                 now_ms=now))
