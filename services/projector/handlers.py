"""Per-event handling: load the little state an event needs, call the pure core, emit ops.

SQL here only *reads*; every write is an operation applied by the writer. Reads flush the
writer first, so they see the effects of earlier events of the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec
import sqlalchemy as sa

from core.billing import billable
from core.completions import completion_ops
from core.projection.billing import Billed, accrue
from core.projection.cancel import Cancellable, plan_cancel
from core.projection.commit import BatchBefore, CommitJob, plan_commit
from core.projection.execution import Child, JobFacts, move, release_children
from core.projection.fold import (
    fold_batch_created,
    fold_batch_deleted,
    fold_control,
    fold_job_groups,
    fold_jobs,
    fold_update_opened,
)
from core.projection.ops import InsertIgnore, Update, UpdateIn
from schemas.base import AttemptResource, CancelReason, JobState
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
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobScheduled,
    JobStarted,
    JobUnschedulable,
)
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
_JOB_ROW = sa.text(
    "SELECT j.job_id, j.job_group_id, j.state, j.cancelled, j.always_run, j.cores_mcpu, "
    "j.inst_coll, j.n_attempts, j.n_max_attempts, j.attempt_id, j.committed, b.user "
    "FROM jobs j JOIN batches b ON b.id = j.batch_id WHERE j.batch_id = :b AND j.job_id = :j")
_CHILDREN = sa.text(
    "SELECT c.job_id, c.job_group_id, c.state, c.cancelled, c.always_run, c.cores_mcpu, "
    "c.inst_coll, c.n_pending_parents FROM job_parents jp JOIN jobs c ON "
    "c.batch_id = jp.batch_id AND c.job_id = jp.job_id "
    "WHERE jp.batch_id = :b AND jp.parent_id = :j AND c.committed")
_GROUP_PROGRESS = _t(
    "SELECT c.job_group_id, c.n_jobs, c.n_completed, g.state FROM job_group_job_counts c "
    "JOIN job_groups g ON g.batch_id = c.batch_id AND g.job_group_id = c.job_group_id "
    "WHERE c.batch_id = :b AND c.job_group_id IN :groups", "groups")
_COMPLETION_COUNTS = _t(
    "SELECT job_group_id, n_jobs, n_succeeded, n_failed, n_cancelled FROM job_group_job_counts "
    "WHERE batch_id = :b AND job_group_id IN :groups", "groups")
_COMPLETE = frozenset({"Success", "Failed", "Error", "Cancelled"})
_BILLING = sa.text(
    "SELECT a.start_time_ms, a.rollup_time_ms, a.end_time_ms, r.resource, r.quantity, "
    "j.job_group_id, b.billing_project, b.user FROM attempts a "
    "JOIN attempt_resources r ON r.batch_id = a.batch_id AND r.job_id = a.job_id "
    "AND r.attempt_id = a.attempt_id "
    "JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id "
    "JOIN batches b ON b.id = a.batch_id "
    "WHERE a.batch_id = :b AND a.job_id = :j AND a.attempt_id = :a")


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
            case JobScheduled() | JobStarted():
                self._start(event, now)
            case JobCompleted():
                self._completed(event, now)
            case AttemptHeartbeat():
                self._bill(event.batch_id, event.job_id, event.attempt_id,
                           event.rollup_time_ms)
            case AttemptLost():
                self._lost(event, now)
            case JobCancelled():
                self._job_cancelled(event, now)
            case JobUnschedulable():
                self._unschedulable(event, now)
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
        # Groups the commit left with no unfinished job (new empty ones; the batch when the
        # update added none) completed: their outbox rows go in this transaction.
        done = [int(g.where["job_group_id"] or 0) for g in plan.groups
                if g.values["state"] == "complete"]
        if done:
            self._w.emit(completion_ops(b, self._read(_COMPLETION_COUNTS, b=b, groups=done),
                                        cancelled, now))

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

    # --- execution --------------------------------------------------------------------------
    def _job(self, batch_id: int, job_id: int) -> Any | None:
        rows = self._read(_JOB_ROW, b=batch_id, j=job_id)
        return rows[0] if rows and rows[0].committed else None

    def _ancestors(self, batch_id: int, group: int) -> list[int]:
        return [int(a) for _, a, _ in self._read(_ANCESTRY, b=batch_id, groups=[group])]

    def _facts(self, batch_id: int, row: Any, user: str | None = None) -> JobFacts:
        cancelled = not row.always_run and (
            bool(row.cancelled) or int(row.job_group_id) in self._cancelled_groups(batch_id))
        return JobFacts(batch_id, int(row.job_id), int(row.job_group_id),
                        str(user if user is not None else row.user), str(row.inst_coll),
                        int(row.cores_mcpu), bool(row.always_run), cancelled)

    def _attempt(self, batch_id: int, job_id: int, attempt_id: str, instance: str) -> None:
        self._w.emit([InsertIgnore("attempts", [{
            "batch_id": batch_id, "job_id": job_id, "attempt_id": attempt_id,
            "instance_name": instance}])])

    def _attempt_resources(self, b: int, j: int, attempt_id: str,
                           resources: Sequence[AttemptResource]) -> None:
        if resources:
            self._w.emit([InsertIgnore("attempt_resources", [{
                "batch_id": b, "job_id": j, "attempt_id": attempt_id,
                "resource": r.resource, "quantity": r.quantity} for r in resources])])

    def _bill(self, b: int, j: int, attempt_id: str, to_ms: int, *,
              start_ms: int | None = None, end_ms: int | None = None) -> None:
        """Bill an attempt from its last rollup time to ``to_ms`` (a heartbeat, its end).

        ``start_ms``/``end_ms`` are what the event knows when the attempt row does not yet (an
        MJC that overtook its MJS). Only ever moves the rollup time forward, so duplicates and
        late heartbeats bill nothing.
        """
        rows = self._read(_BILLING, b=b, j=j, a=attempt_id)
        if not rows:
            return  # never scheduled with resources: nothing to bill
        first = rows[0]
        start = first.start_time_ms if first.start_time_ms is not None else start_ms
        end = first.end_time_ms if first.end_time_ms is not None else end_ms
        interval = billable(start, first.rollup_time_ms, end, to_ms)
        if interval is None:
            return
        who = Billed(b, j, self._ancestors(b, int(first.job_group_id)),
                     str(first.billing_project), str(first.user))
        resources = [AttemptResource(resource=str(r.resource), quantity=int(r.quantity))
                     for r in rows]
        self._w.emit(accrue(who, resources, *interval, self._token))
        self._w.emit([Update("attempts", {"rollup_time_ms": interval[1]},
                             {"batch_id": b, "job_id": j, "attempt_id": attempt_id})])

    def _start(self, event: JobScheduled | JobStarted, now: int) -> None:
        """SJ or MJS: the attempt exists; a Ready (or Creating) job becomes Running.

        MJS may overtake SJ, and either may be duplicated: the first one moves the job."""
        b, j = event.batch_id, event.job_id
        self._attempt(b, j, event.attempt_id, event.instance_name)
        self._attempt_resources(b, j, event.attempt_id, event.resources)
        if isinstance(event, JobStarted):
            self._w.emit([Update("attempts", {"start_time_ms": event.start_time_ms},
                                 {"batch_id": b, "job_id": j, "attempt_id": event.attempt_id})])
        row = self._job(b, j)
        if row is None:
            return
        values: dict[str, Any] = {}
        if row.state in ("Ready", "Creating"):
            facts = self._facts(b, row)
            self._w.emit(move(facts, row.state, "Running", self._ancestors(b, facts.job_group_id),
                              self._token))
            values = {"state": "Running", "attempt_id": event.attempt_id,
                      "instance_name": event.instance_name, "n_attempts": row.n_attempts + 1}
        if isinstance(event, JobStarted) and (values or row.attempt_id == event.attempt_id):
            values["start_time_ms"] = event.start_time_ms
        if values:
            self._w.emit([Update("jobs", values, {"batch_id": b, "job_id": j})])

    def _completed(self, event: JobCompleted, now: int) -> None:
        """MJC: the first completion of a job decides its state; duplicates only fill times."""
        b, j = event.batch_id, event.job_id
        self._attempt(b, j, event.attempt_id, event.instance_name)
        self._attempt_resources(b, j, event.attempt_id, event.resources)
        self._bill(b, j, event.attempt_id, event.end_time_ms, start_ms=event.start_time_ms,
                   end_ms=event.end_time_ms)
        self._w.emit([Update("attempts", {
            "start_time_ms": event.start_time_ms, "end_time_ms": event.end_time_ms}, {
            "batch_id": b, "job_id": j, "attempt_id": event.attempt_id})])
        row = self._job(b, j)
        if row is None or row.state in _COMPLETE:
            return
        self._end(b, row, event.state, now, {
            "exit_code": event.exit_code, "status": event.status,
            "start_time_ms": event.start_time_ms, "end_time_ms": event.end_time_ms,
            "attempt_id": event.attempt_id, "instance_name": event.instance_name})

    def _lost(self, event: AttemptLost, now: int) -> None:
        b, j = event.batch_id, event.job_id
        self._bill(b, j, event.attempt_id, event.end_time_ms, end_ms=event.end_time_ms)
        self._w.emit([Update("attempts", {"end_time_ms": event.end_time_ms,
                                          "reason": event.reason},
                             {"batch_id": b, "job_id": j, "attempt_id": event.attempt_id})])
        row = self._job(b, j)
        if row is None or row.state != "Running" or row.attempt_id != event.attempt_id:
            return
        if row.n_attempts >= row.n_max_attempts:
            self._end(b, row, "Error", now, {"end_time_ms": event.end_time_ms})
            return
        facts = self._facts(b, row)
        self._w.emit(move(facts, "Running", "Ready", self._ancestors(b, facts.job_group_id),
                          self._token))
        self._w.emit([Update("jobs", {"state": "Ready", "attempt_id": None,
                                      "instance_name": None},
                             {"batch_id": b, "job_id": j})])

    def _job_cancelled(self, event: JobCancelled, now: int) -> None:
        row = self._job(event.batch_id, event.job_id)
        if row is None or row.state in _COMPLETE:
            return
        self._end(event.batch_id, row, "Cancelled", now,
                  {"cancel_reason": event.reason, "end_time_ms": now})

    def _unschedulable(self, event: JobUnschedulable, now: int) -> None:
        """A Ready job no worker can ever hold ends in Error, with the scheduler's reason."""
        row = self._job(event.batch_id, event.job_id)
        if not event.permanent or row is None or row.state != "Ready":
            return
        status = msgspec.json.encode({"error": f"unschedulable: {event.reason}"}).decode()
        self._end(event.batch_id, row, "Error", now, {"status": status, "end_time_ms": now})

    def _end(self, b: int, row: Any, state: JobState, now: int, values: dict[str, Any]) -> None:
        """A job ends: move its counters, release its children, complete what completed."""
        facts = self._facts(b, row)
        ancestors = self._ancestors(b, facts.job_group_id)
        self._w.emit(move(facts, row.state, state, ancestors, self._token))
        self._w.emit([Update("jobs", {"state": state, **values},
                             {"batch_id": b, "job_id": facts.job_id})])
        children = [Child(self._facts(b, c, facts.user), c.state, int(c.n_pending_parents))
                    for c in self._read(_CHILDREN, b=b, j=facts.job_id)]
        if children:
            groups = {c.facts.job_group_id for c in children}
            ancestors_of = {g: self._ancestors(b, g) for g in groups}
            releases, incs = release_children(state, children, ancestors_of, self._token)
            self._w.emit(incs)
            by_values: dict[tuple[int, str, bool], list[int]] = defaultdict(list)
            for r in releases:
                by_values[(r.n_pending_parents, r.state, r.cancelled_flag)].append(r.job_id)
            for (pending, new_state, flag), ids in sorted(by_values.items()):
                set_values: dict[str, Any] = {"n_pending_parents": pending, "state": new_state}
                if flag:
                    set_values |= {"cancelled": True, "cancel_reason": "parent_failed"}
                self._w.emit([UpdateIn("jobs", set_values, {"batch_id": b}, "job_id", ids)])
        done: list[int] = []
        for group, n_jobs, n_completed, group_state in self._read(
                _GROUP_PROGRESS, b=b, groups=ancestors):
            if n_completed == n_jobs and group_state != "complete":
                done.append(int(group))
                self._w.emit([Update("job_groups", {"state": "complete",
                                                    "time_completed_ms": now},
                                     {"batch_id": b, "job_group_id": int(group)})])
                if int(group) == 0:
                    self._w.emit([Update("batches", {"state": "complete",
                                                     "time_completed_ms": now}, {"id": b})])
        if done:  # the outbox rows of what completed, in the same transaction
            self._w.emit(completion_ops(b, self._read(_COMPLETION_COUNTS, b=b, groups=done),
                                        self._cancelled_groups(b), now))
