"""Per-event handling: load the little state an event needs, call the pure core, emit ops.

Scheduler-topic events (instances, elections) and the per-minute ``event_rates`` counts of
execution events need no reads: :mod:`core.projection.instances` maps them to operations.

SQL here only *reads*; every write is an operation applied by the writer. Reads flush the
writer first, so they see the effects of earlier events of the same batch.

Execution events (SJ, MJS, MJC, heartbeats, losses, job cancels) do not read per event. What a
handler loads of a batch (:class:`services.projector.state.BatchState`: job rows, their
attempts and children, group ancestry and progress, cancelled groups) lives in the partition's
:class:`~services.projector.state.PartitionCache`, which the sink keeps between transactions:
the partition's owner is the only writer of its batches' rows. :meth:`Handler.prepare` loads
what a transaction's execution events need and the cache lacks, in a few queries per batch,
before anything is written; every operation the handler emits on a cached row also changes the
cached copy. Any other event of a batch (a bunch, a commit, a cancel, ...) drops what was
cached for it, before and after it is handled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

import msgspec
import sqlalchemy as sa

from core.billing import (
    add_usage,
    billable,
    resources_of_text,
    resources_text,
    usage_of_text,
    usage_text,
)
from core.completions import completion_ops
from core.id_tally import IdTally
from core.projection.billing import Billed
from core.projection.cancel import Cancellable, plan_cancel
from core.projection.commit import (
    BatchBefore,
    Resolved,
    StagedCounts,
    plan_commit,
    stage_heads,
)
from core.projection.execution import Child, JobFacts, Release, release_children
from core.projection.fold import (
    fold_batch_created,
    fold_batch_deleted,
    fold_control,
    fold_job_groups,
    fold_jobs,
    fold_update_opened,
)
from core.projection.instances import count_event, fold_election, fold_instance
from core.projection.ops import InsertIgnore, Update, UpdateIn
from core.projection.waiting import EPOCH_SCOPE, fold_waiting_reasons, needs_reset
from schemas.base import AttemptResource, BatchEvent, CancelReason, JobState
from schemas.batch import (
    BatchCancelled,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupsSubmitted,
    JobHeadsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.control import ControlEvent, WaitingReasonsChanged
from schemas.envelope import Envelope
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
from schemas.infra import InstanceEvent, SchedulerElected
from services.projector.state import AttemptRow, BatchState, JobRow, PartitionCache
from services.projector.writer import Writer


def _t(sql: str, *expanding: str) -> sa.TextClause:
    stmt = sa.text(sql)
    return stmt.bindparams(*(sa.bindparam(e, expanding=True) for e in expanding))


_ANCESTRY = _t("SELECT job_group_id, ancestor_id, level FROM job_group_self_and_ancestors "
               "WHERE batch_id = :b AND job_group_id IN :groups", "groups")
_UPDATE = sa.text("SELECT committed, start_job_id, n_jobs FROM batch_updates "
                  "WHERE batch_id = :b AND update_id = :u")
_BATCH = sa.text(
    "SELECT b.user, b.n_jobs, b.time_closed_ms, c.n_completed FROM batches b "
    "JOIN job_group_job_counts c ON c.batch_id = b.id AND c.job_group_id = 0 WHERE b.id = :b")
_EXISTING_JOBS = sa.text(
    "SELECT job_id FROM jobs WHERE batch_id = :b AND job_id BETWEEN :lo AND :hi")
_STAGED = sa.text(
    "SELECT job_group_id, inst_coll, n_jobs, n_ready, ready_cores_mcpu, n_ready_always_run, "
    "ready_always_run_cores_mcpu FROM batch_update_job_counts "
    "WHERE batch_id = :b AND update_id = :u")
# Edges from the update's jobs (a primary-key range) to parents of earlier updates that ended.
_ENDED_EARLIER_PARENTS = sa.text(
    "SELECT jp.job_id, p.state FROM job_parents jp "
    "JOIN jobs p ON p.batch_id = jp.batch_id AND p.job_id = jp.parent_id "
    "WHERE jp.batch_id = :b AND jp.job_id >= :lo AND jp.job_id < :hi AND jp.parent_id < :lo "
    "AND p.state IN ('Success', 'Failed', 'Error', 'Cancelled') ORDER BY jp.job_id, jp.parent_id")
_SUBMITTED_ROWS = _t(
    "SELECT j.job_id, j.job_group_id, j.state, j.cancelled, j.always_run, j.cores_mcpu, "
    "j.inst_coll, j.n_pending_parents FROM jobs j WHERE j.batch_id = :b AND j.job_id IN :ids",
    "ids")
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
_JOB_ROWS = _t(
    "SELECT j.job_id, j.job_group_id, j.state, j.cancelled, j.always_run, j.cores_mcpu, "
    "j.inst_coll, j.n_attempts, j.n_max_attempts, j.attempt_id, j.n_pending_parents, b.user, "
    "b.billing_project, j.resource_usage FROM jobs j JOIN batches b ON b.id = j.batch_id "
    "JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id "
    "WHERE j.batch_id = :b AND u.committed AND j.job_id IN :ids", "ids")
# Windows of ids are loaded by key range, not by IN lists: rendering and parsing 512 ids per
# query made these reads cost ~4 ms each (measured), the range ~0.3 ms. Every range is served by
# a primary key or index led by (batch_id, the job id column).
_JOB_RANGE = sa.text(
    "SELECT j.job_id, j.job_group_id, j.state, j.cancelled, j.always_run, j.cores_mcpu, "
    "j.inst_coll, j.n_attempts, j.n_max_attempts, j.attempt_id, j.n_pending_parents, b.user, "
    "b.billing_project, j.resource_usage FROM jobs j JOIN batches b ON b.id = j.batch_id "
    "JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id "
    "WHERE j.batch_id = :b AND u.committed AND j.job_id BETWEEN :lo AND :hi")
_ATTEMPT_RANGE = sa.text(
    "SELECT job_id, attempt_id, start_time_ms, rollup_time_ms, end_time_ms, resources "
    "FROM attempts WHERE batch_id = :b AND job_id BETWEEN :lo AND :hi")
_CHILD_RANGE = sa.text(
    "SELECT parent_id, job_id FROM job_parents WHERE batch_id = :b "
    "AND parent_id BETWEEN :lo AND :hi")
_LOAD_CHUNK = 5_000
_LOAD_WINDOW = 8192
_GROUP_PROGRESS = _t(
    "SELECT c.job_group_id, c.n_jobs, c.n_completed, g.state FROM job_group_job_counts c "
    "JOIN job_groups g ON g.batch_id = c.batch_id AND g.job_group_id = c.job_group_id "
    "WHERE c.batch_id = :b AND c.job_group_id IN :groups", "groups")
_COMPLETION_COUNTS = _t(
    "SELECT batch_id, job_group_id, n_jobs, n_succeeded, n_failed, n_cancelled "
    "FROM job_group_job_counts WHERE batch_id IN :bs AND job_group_id IN :groups",
    "bs", "groups")
_WAITING_EPOCH = sa.text("SELECT epoch FROM waiting_reasons_epoch WHERE scope = :s")
_WAITING_USERS = sa.text("SELECT user, inst_coll FROM user_waiting_reasons")
_WAITING_JOBS = sa.text("SELECT batch_id, job_id FROM job_waiting_reasons")
_COMPLETE = frozenset({"Success", "Failed", "Error", "Cancelled"})
_EXECUTION = (JobScheduled, JobStarted, JobCompleted, AttemptHeartbeat, AttemptLost,
              JobCancelled, JobUnschedulable, JobsScheduled, JobsCompleted, JobsCancelled)


class Handler:
    """Folds envelopes into operations on one connection, for one partition's token."""

    def __init__(self, conn: sa.Connection, writer: Writer, token: int,
                 cache: PartitionCache | None = None) -> None:
        self._conn = conn
        self._w = writer
        self._token = token
        # The partition's batches, kept between transactions by the sink (a fresh cache: this
        # transaction only).
        self._batches = PartitionCache() if cache is None else cache
        self._upcoming: dict[int, set[int]] = defaultdict(set)
        # Completions noted but not yet written to the outbox, per batch: (groups, cancelled
        # groups then, time). Their counts are read once, at settle(), not at each completion:
        # a read flushes the writer, and flushing at every completion split the transaction's
        # merged statements into many small ones (43% of replay time, measured).
        self._done: dict[int, list[tuple[list[int], frozenset[int], int]]] = {}

    def prepare(self, envelopes: Sequence[Envelope]) -> None:
        """Load, in a few queries per batch and before anything is written, what this
        transaction's execution events need and the cache lacks: their jobs' rows, attempts,
        children and children's rows, their groups' ancestry and progress, cancelled groups.
        Reading later would first flush the writer, splitting its merged statements."""
        for env in envelopes:
            event = env.event
            if isinstance(event, JobsScheduled | JobsCompleted):
                self._upcoming[event.batch_id].update(a.job_id for a in event.attempts)
            elif isinstance(event, JobsCancelled):
                self._upcoming[event.batch_id].update(event.job_ids)
            elif isinstance(event, _EXECUTION):
                self._upcoming[event.batch_id].add(event.job_id)
        for b, ids in self._upcoming.items():
            st = self._batch(b)
            missing = sorted(ids - st.loaded)
            if missing:
                self._load(b, st, missing)
            rows = [r for j in ids if (r := st.jobs.get(j)) is not None]
            rows += [r for row in rows for c in st.children.get(row.job_id, ())
                     if (r := st.jobs.get(c)) is not None]
            if not rows:
                continue
            self._load_ancestry(b, {r.job_group_id for r in rows})
            self._progress(b, sorted({a for r in rows
                                      for a in st.ancestry.get(r.job_group_id, ())}))
            self._cancelled_groups(b)

    def _read(self, stmt: sa.TextClause, **params: object) -> Sequence[Any]:
        self._w.flush()
        return self._conn.execute(stmt, params).all()

    def settle(self, batch_id: int | None = None) -> None:
        """Write the outbox rows of the completions noted so far (of ``batch_id``, or all).

        A completed group's counts cannot change until an update adds jobs to its batch, so
        reading them later in the transaction gives what they were at the completion, provided
        this runs before any other event of the batch that is not an execution event (commits
        among them) and before the transaction ends (the sink calls it).
        """
        todo = list(self._done) if batch_id is None else [batch_id] * (batch_id in self._done)
        if not todo:
            return
        pending = {b: self._done.pop(b) for b in todo}
        groups = sorted({g for entries in pending.values() for gs, _, _ in entries for g in gs})
        counts = {(int(row[0]), int(row[1])): row[1:]
                  for row in self._read(_COMPLETION_COUNTS, bs=sorted(pending), groups=groups)}
        for b, entries in sorted(pending.items()):
            for gs, cancelled, now in entries:
                self._w.emit(completion_ops(b, [counts[(b, g)] for g in gs if (b, g) in counts],
                                            cancelled, now))

    def handle(self, env: Envelope) -> bool:
        """Fold one envelope; False if its tag has no projection (yet)."""
        event = env.event
        if isinstance(event, BatchEvent) and not isinstance(event, _EXECUTION):
            self.settle(event.batch_id)
            self._batches.drop(event.batch_id)
            try:
                return self._handle(env)
            finally:
                self._batches.drop(event.batch_id)
        return self._handle(env)

    def _handle(self, env: Envelope) -> bool:
        event, now = env.event, env.time_ms
        match event:
            case WaitingReasonsChanged():
                self._waiting_reasons(event, now)
            case ControlEvent():
                self._w.emit(fold_control(event, now))
            case BatchCreated():
                self._w.emit(fold_batch_created(event, now))
                if event.empty:  # complete at once: its outbox rows, as a commit of no jobs
                    self._done.setdefault(event.batch_id, []).append(([0], frozenset(), now))
            case UpdateOpened():
                self._update_opened(event, now)
            case JobGroupsSubmitted():
                self._job_groups(event, now)
            case JobHeadsSubmitted():
                self._jobs(event)
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
                self._w.emit(count_event(event, now, self._token))
            case JobsScheduled():
                for sj in event.expand():
                    self._start(sj, now)
                self._w.emit(count_event(event, now, self._token))
            case JobCompleted():
                self._completed(event, now)
                self._w.emit(count_event(event, now, self._token))
            case JobsCompleted():
                for mjc in event.expand():
                    self._completed(mjc, now)
                self._w.emit(count_event(event, now, self._token))
            case AttemptHeartbeat():
                self._bill(event.batch_id, event.job_id, event.attempt_id,
                           event.rollup_time_ms)
            case AttemptLost():
                self._lost(event, now)
            case JobCancelled():
                self._job_cancelled(event, now)
                self._w.emit(count_event(event, now, self._token))
            case JobsCancelled():
                for cancelled in event.expand():
                    self._job_cancelled(cancelled, now)
                self._w.emit(count_event(event, now, self._token))
            case JobUnschedulable():
                self._unschedulable(event, now)
            case InstanceEvent():
                self._w.emit(fold_instance(event, now))
            case SchedulerElected():
                self._w.emit(fold_election(event, now))
            case _:
                return False
        return True

    def _waiting_reasons(self, event: WaitingReasonsChanged, now: int) -> None:
        """Why ready jobs wait: stale epochs ignored, a newer epoch replaces every row."""
        stored = self._read(_WAITING_EPOCH, s=EPOCH_SCOPE)
        epoch = int(stored[0][0]) if stored else None
        users: list[tuple[str, str]] = []
        jobs: list[tuple[int, int]] = []
        if needs_reset(event, epoch):  # once per election: every row the old leader left
            users = [(str(u), str(ic)) for u, ic in self._read(_WAITING_USERS)]
            jobs = [(int(b), int(j)) for b, j in self._read(_WAITING_JOBS)]
        self._w.emit(fold_waiting_reasons(event, now, stored_epoch=epoch, existing_users=users,
                                          existing_jobs=jobs))

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

    def _update_opened(self, event: UpdateOpened, now: int) -> None:
        b, u = event.batch_id, event.update_id
        if not self._read(_UPDATE, b=b, u=u):  # new: its bunches all come after this
            self._batches.open_update(b, u, IdTally(event.start_job_id, event.n_jobs))
        self._w.emit(fold_update_opened(event, now))

    def _jobs(self, event: JobHeadsSubmitted) -> None:
        """A bunch: rows and staged counts of the jobs not projected before (a client retry
        resubmits a bunch); nothing once the update is committed (its jobs were all in).

        For an update opened under this cache, which jobs are in is known without reading,
        and the bunch's statements are sent without waiting for them: the database writes
        this bunch while the next events are folded (the writer's pipeline).
        """
        b, ids = event.batch_id, [j.job_id for j in event.jobs]
        if not ids:
            return
        tally = self._batches.open_updates.get((b, event.update_id))
        if tally is not None:
            new = (list(event.jobs) if not tally.seen_within(min(ids), max(ids) + 1)
                   else [j for j in event.jobs if j.job_id not in tally])
        else:
            update = self._read(_UPDATE, b=b, u=event.update_id)
            if update and update[0][0]:
                return
            existing = {int(j) for (j,) in self._read(_EXISTING_JOBS, b=b, lo=min(ids),
                                                         hi=max(ids))}
            new = [j for j in event.jobs if j.job_id not in existing]
        if not new:
            return
        self._w.emit(fold_jobs(event, new))
        self._w.emit(stage_heads(b, event.update_id, new))
        if tally is not None:
            tally.add(j.job_id for j in new)
            self._w.flush(wait=False)

    def _commit(self, event: UpdateCommitted, now: int) -> None:
        b, u = event.batch_id, event.update_id
        self._batches.open_updates.pop((b, u), None)
        update = self._read(_UPDATE, b=b, u=u)
        if not update or update[0][0]:
            return  # unknown (ingest validates) or already committed: a duplicate request
        _, start, n_update_jobs = update[0]
        (user, n_jobs, time_closed, n_completed), = self._read(_BATCH, b=b)
        staged = [StagedCounts(int(g), str(ic), *(int(v) for v in rest))
                  for g, ic, *rest in self._read(_STAGED, b=b, u=u)]
        ended: dict[int, list[JobState]] = defaultdict(list)
        for child, state in self._read(_ENDED_EARLIER_PARENTS, b=b, lo=int(start),
                                       hi=int(start) + int(n_update_jobs)):
            ended[int(child)].append(state)
        rows = {int(r.job_id): r for r in self._read(_SUBMITTED_ROWS, b=b, ids=sorted(ended))
                } if ended else {}
        update_groups = [int(g) for (g,) in self._read(_UPDATE_GROUPS, b=b, u=u)]
        cancelled = self._cancelled_groups(b)
        involved = sorted({c.job_group_id for c in staged} | set(update_groups)
                          | {int(r.job_group_id) for r in rows.values()})
        ancestors: dict[int, list[int]] = defaultdict(list)
        for group, ancestor, _ in self._read(_ANCESTRY, b=b, groups=involved or [0]):
            ancestors[int(group)].append(int(ancestor))
        resolved = []
        for j, states in sorted(ended.items()):
            r = rows[j]
            effective = not r.always_run and (bool(r.cancelled) or int(r.job_group_id)
                                              in cancelled)
            facts = JobFacts(b, j, int(r.job_group_id), str(user), str(r.inst_coll),
                             int(r.cores_mcpu), bool(r.always_run), effective)
            resolved.append(Resolved(Child(facts, r.state, int(r.n_pending_parents)),
                                     tuple(states)))
        plan = plan_commit(
            batch=BatchBefore(b, str(user), int(n_jobs), int(n_completed),
                              None if time_closed is None else int(time_closed)),
            staged=staged, resolved=resolved, cancelled_groups=cancelled, ancestors=ancestors,
            update_groups=update_groups, token=self._token, now_ms=now)
        self._w.emit(plan.increments)
        self._write_releases(b, plan.releases)
        self._w.emit([plan.batch, *plan.groups, Update(
            "batch_updates", {"committed": True, "time_committed_ms": now},
            {"batch_id": b, "update_id": u})])
        # Groups the commit left with no unfinished job (new empty ones; the batch when the
        # update added none) completed: their outbox rows go in this transaction.
        done = [int(cast(int | None, g.where["job_group_id"]) or 0) for g in plan.groups
                if g.values["state"] == "complete"]
        if done:
            self._done.setdefault(b, []).append((done, cancelled, now))

    def _write_releases(self, b: int, releases: Sequence[Release]) -> None:
        """The new rows of released jobs, one statement per distinct set of values."""
        by_values: dict[tuple[int, JobState, bool], list[int]] = defaultdict(list)
        for r in releases:
            by_values[(r.n_pending_parents, r.state, r.cancelled_flag)].append(r.job_id)
        for (pending, new_state, flag), ids in sorted(by_values.items()):
            set_values: dict[str, Any] = {"n_pending_parents": pending, "state": new_state}
            if flag:
                set_values |= {"cancelled": True, "cancel_reason": "parent_failed"}
            self._w.emit([UpdateIn("jobs", set_values, {"batch_id": b}, "job_id", ids)])

    def _cancelled_groups(self, batch_id: int) -> frozenset[int]:
        """Groups cancelled directly or through an ancestor (rows exist for descendants)."""
        st = self._batch(batch_id)
        if st.cancelled is None:
            st.cancelled = frozenset(int(g) for (g,) in self._read(_CANCELLED, b=batch_id))
        return st.cancelled

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

    # --- execution: state loaded per batch, kept in step with what is emitted ----------------
    def _batch(self, batch_id: int) -> BatchState:
        return self._batches.get(batch_id)

    def _job(self, batch_id: int, job_id: int) -> JobRow | None:
        """A committed job's row (loaded with the other jobs of this transaction), or None."""
        st = self._batch(batch_id)
        if job_id not in st.loaded:
            upcoming = self._upcoming.get(batch_id, set())
            self._load(batch_id, st, sorted({job_id} | (upcoming - st.loaded)))
        return st.jobs.get(job_id)

    def _load(self, b: int, st: BatchState, wanted: list[int]) -> None:
        """Rows, attempts and children of ``wanted`` and of the jobs beside them: the whole
        window of ``_LOAD_WINDOW`` ids around each (a batch runs roughly in id order, so its
        next jobs' first events need no reads of their own). Ids with no committed job are
        cached as None: any event that could commit one drops the batch's cache. Windows
        already loaded are not read again, and what a range returns of loaded jobs is ignored
        (the cache is as new as the database)."""
        windows = sorted({j // _LOAD_WINDOW for j in wanted})
        ids = [j for w in windows for j in range(w * _LOAD_WINDOW, (w + 1) * _LOAD_WINDOW)
               if j not in st.loaded]
        for i in range(0, len(ids), _LOAD_CHUNK):
            chunk = ids[i:i + _LOAD_CHUNK]
            todo = set(chunk)
            for lo, hi in _runs(chunk):
                self._load_range(b, st, lo, hi, todo)
            unknown = sorted({c for j in chunk for c in st.children[j] if c not in st.jobs})
            if unknown:
                self._rows(b, st, unknown)
            st.loaded.update(chunk)

    def _load_range(self, b: int, st: BatchState, lo: int, hi: int, todo: set[int]) -> None:
        """Rows, attempts and children of the jobs in ``todo`` with ids in ``[lo, hi]``."""
        for j in range(lo, hi + 1):
            if j in todo:
                st.jobs[j] = None
                st.children[j] = []
        for r in self._read(_JOB_RANGE, b=b, lo=lo, hi=hi):
            job_id = int(r[0])
            if job_id in todo:
                st.jobs[job_id] = _job_row(r)
        for job_id, attempt_id, start, rollup, end, resources in self._read(
                _ATTEMPT_RANGE, b=b, lo=lo, hi=hi):
            if int(job_id) in todo:
                st.attempts[(int(job_id), str(attempt_id))] = AttemptRow(
                    start, rollup, end, resources_of_text(resources))
        for parent, child in self._read(_CHILD_RANGE, b=b, lo=lo, hi=hi):
            if int(parent) in todo:
                st.children[int(parent)].append(int(child))

    def _rows(self, b: int, st: BatchState, ids: Sequence[int]) -> None:
        """(Re)load job rows only: absent ones are recorded as None (not committed)."""
        for j in ids:
            st.jobs[j] = None
        for r in self._read(_JOB_ROWS, b=b, ids=list(ids)):
            st.jobs[int(r[0])] = _job_row(r)

    def _ancestors(self, batch_id: int, group: int) -> list[int]:
        """The group and its ancestors up to 0 (immutable once the group exists)."""
        ancestry = self._batch(batch_id).ancestry
        found = ancestry.get(group)
        if found is None:
            self._load_ancestry(batch_id, [group])
            found = ancestry.get(group, [])
        return found

    def _load_ancestry(self, batch_id: int, groups: Iterable[int]) -> None:
        """Load the ancestry of ``groups``; a group not there yet is not remembered."""
        ancestry = self._batch(batch_id).ancestry
        missing = sorted({g for g in groups if g not in ancestry})
        if not missing:
            return
        found: dict[int, list[int]] = defaultdict(list)
        for group, ancestor, _ in self._read(_ANCESTRY, b=batch_id, groups=missing):
            found[int(group)].append(int(ancestor))
        ancestry.update(found)

    def _facts(self, batch_id: int, row: JobRow) -> JobFacts:
        cancelled = not row.always_run and (
            row.cancelled or row.job_group_id in self._cancelled_groups(batch_id))
        return JobFacts(batch_id, row.job_id, row.job_group_id, row.user, row.inst_coll,
                        row.cores_mcpu, row.always_run, cancelled)

    def _attempt(self, batch_id: int, job_id: int, attempt_id: str, instance: str,
                 resources: Sequence[AttemptResource]) -> AttemptRow:
        """The attempt exists (inserted if new) and is billed for ``resources`` too (the first
        quantity of each resource stays); its cached row. Call after :meth:`_job`.

        A cached attempt was loaded from its row or inserted earlier in this transaction, so
        it needs no insert: a redundant one would also force the writer to give up merging the
        attempt updates it holds back (the insert could precede them).
        """
        attempts = self._batch(batch_id).attempts
        att = attempts.get((job_id, attempt_id))
        if att is None:
            att = attempts[(job_id, attempt_id)] = AttemptRow()
            for r in resources:
                att.resources.setdefault(r.resource, r.quantity)
            self._w.emit([InsertIgnore("attempts", [{
                "batch_id": batch_id, "job_id": job_id, "attempt_id": attempt_id,
                "instance_name": instance, "resources": resources_text(att.resources)}])])
        elif any(r.resource not in att.resources for r in resources):
            for r in resources:
                att.resources.setdefault(r.resource, r.quantity)
            self._update_attempt(batch_id, job_id, attempt_id,
                                 {"resources": resources_text(att.resources)})
        return att

    def _update_attempt(self, b: int, j: int, attempt_id: str, values: dict[str, Any]) -> None:
        """Set columns of an attempt, in the database and in the cache (if it is there)."""
        self._w.update_row("attempts", (b, j, attempt_id), values)
        att = self._batch(b).attempts.get((j, attempt_id))
        if att is not None:
            for column in ("start_time_ms", "rollup_time_ms", "end_time_ms"):
                if column in values:
                    setattr(att, column, values[column])

    def _bill(self, b: int, j: int, attempt_id: str, to_ms: int, *,
              start_ms: int | None = None, end_ms: int | None = None) -> None:
        """Bill an attempt from its last rollup time to ``to_ms`` (a heartbeat, its end).

        ``start_ms``/``end_ms`` are what the event knows when the attempt row does not yet (an
        MJC that overtook its MJS). Only ever moves the rollup time forward, so duplicates and
        late heartbeats bill nothing.
        """
        row = self._job(b, j)
        att = self._batch(b).attempts.get((j, attempt_id))
        if row is None or att is None or not att.resources:
            return  # never scheduled with resources (or not a committed job): nothing to bill
        start = att.start_time_ms if att.start_time_ms is not None else start_ms
        end = att.end_time_ms if att.end_time_ms is not None else end_ms
        interval = billable(start, att.rollup_time_ms, end, to_ms)
        if interval is None:
            return
        who = Billed(b, j, self._ancestors(b, row.job_group_id), row.billing_project, row.user)
        self._w.accrue(who, att.resources, *interval, self._token)
        self._update_attempt(b, j, attempt_id, {"rollup_time_ms": interval[1]})
        job_usage = usage_of_text(row.resource_usage)
        add_usage(job_usage, att.resources, interval[1] - interval[0])
        row.resource_usage = usage_text(job_usage)
        self._w.update_row("jobs", (b, j), {"resource_usage": row.resource_usage})

    def _start(self, event: JobScheduled | JobStarted, now: int) -> None:
        """SJ or MJS: the attempt exists; a Ready (or Creating) job becomes Running.

        MJS may overtake SJ, and either may be duplicated: the first one moves the job."""
        b, j = event.batch_id, event.job_id
        row = self._job(b, j)
        self._attempt(b, j, event.attempt_id, event.instance_name, event.resources)
        if isinstance(event, JobStarted):
            self._update_attempt(b, j, event.attempt_id, {"start_time_ms": event.start_time_ms})
        if row is None:
            return
        values: dict[str, Any] = {}
        if row.state in ("Ready", "Creating"):
            facts = self._facts(b, row)
            self._w.move(facts, row.state, "Running", self._ancestors(b, facts.job_group_id),
                         self._token)
            values = {"state": "Running", "attempt_id": event.attempt_id,
                      "instance_name": event.instance_name, "n_attempts": row.n_attempts + 1}
            row.state, row.attempt_id = "Running", event.attempt_id
            row.n_attempts += 1
        if isinstance(event, JobStarted) and (values or row.attempt_id == event.attempt_id):
            values["start_time_ms"] = event.start_time_ms
        if values:
            self._w.update_row("jobs", (b, j), values)

    def _completed(self, event: JobCompleted, now: int) -> None:
        """MJC: the first completion of a job decides its state; duplicates only fill times."""
        b, j = event.batch_id, event.job_id
        row = self._job(b, j)
        self._attempt(b, j, event.attempt_id, event.instance_name, event.resources)
        self._bill(b, j, event.attempt_id, event.end_time_ms, start_ms=event.start_time_ms,
                   end_ms=event.end_time_ms)
        self._update_attempt(b, j, event.attempt_id, {
            "start_time_ms": event.start_time_ms, "end_time_ms": event.end_time_ms})
        if row is None or row.state in _COMPLETE:
            return
        self._end(b, row, event.state, now, {
            "exit_code": event.exit_code, "status": event.status,
            "start_time_ms": event.start_time_ms, "end_time_ms": event.end_time_ms,
            "attempt_id": event.attempt_id, "instance_name": event.instance_name,
            "main_start_ms": event.main_start_ms, "main_end_ms": event.main_end_ms,
            "worker_region": event.region})

    def _lost(self, event: AttemptLost, now: int) -> None:
        b, j = event.batch_id, event.job_id
        row = self._job(b, j)
        self._bill(b, j, event.attempt_id, event.end_time_ms, end_ms=event.end_time_ms)
        self._update_attempt(b, j, event.attempt_id, {"end_time_ms": event.end_time_ms,
                                                      "reason": event.reason})
        if row is None or row.state != "Running" or row.attempt_id != event.attempt_id:
            return
        if row.n_attempts >= row.n_max_attempts:
            self._end(b, row, "Error", now, {"end_time_ms": event.end_time_ms})
            return
        facts = self._facts(b, row)
        self._w.move(facts, "Running", "Ready", self._ancestors(b, facts.job_group_id),
                     self._token)
        self._w.update_row("jobs", (b, j), {"state": "Ready", "attempt_id": None,
                                            "instance_name": None})
        row.state, row.attempt_id = "Ready", None

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

    def _progress(self, b: int, groups: Sequence[int]) -> dict[int, list[Any]]:
        """[n_jobs, n_completed, state] of ``groups`` (loaded once, then kept in step)."""
        st = self._batch(b)
        missing = [g for g in groups if g not in st.progress]
        if missing:
            for group, n_jobs, n_completed, state in self._read(_GROUP_PROGRESS, b=b,
                                                                groups=missing):
                st.progress[int(group)] = [int(n_jobs), int(n_completed), str(state)]
        return st.progress

    def _children(self, b: int, job_id: int) -> list[JobRow]:
        """The committed children of a loaded job, with their current rows."""
        st = self._batch(b)
        ids = st.children.get(job_id, [])
        unknown = [c for c in ids if c not in st.jobs]
        if unknown:
            self._rows(b, st, unknown)
        return [row for c in ids if (row := st.jobs.get(c)) is not None]

    def _end(self, b: int, row: JobRow, state: JobState, now: int,
             values: dict[str, Any]) -> None:
        """A job ends: move its counters, release its children, complete what completed."""
        facts = self._facts(b, row)
        ancestors = self._ancestors(b, facts.job_group_id)
        progress = self._progress(b, ancestors)  # loaded before the move below changes it
        self._w.move(facts, row.state, state, ancestors, self._token)
        self._w.update_row("jobs", (b, facts.job_id), {"state": state, **values})
        row.state = state
        row.attempt_id = values.get("attempt_id", row.attempt_id)
        for g in ancestors:  # a live job became complete: n_completed + 1 up the tree
            if g in progress:
                progress[g][1] += 1
        rows = {c.job_id: c for c in self._children(b, facts.job_id)}
        children = [Child(self._facts(b, c), c.state, c.n_pending_parents) for c in rows.values()]
        if children:
            groups = {c.facts.job_group_id for c in children}
            ancestors_of = {g: self._ancestors(b, g) for g in groups}
            releases, incs = release_children(state, children, ancestors_of, self._token)
            self._w.emit(incs)
            for r in releases:
                child = rows[r.job_id]
                child.n_pending_parents, child.state = r.n_pending_parents, r.state
                child.cancelled = child.cancelled or r.cancelled_flag
            self._write_releases(b, releases)
        done: list[int] = []
        for group in ancestors:
            entry = progress.get(group)
            if entry is None:
                continue
            n_jobs, n_completed, group_state = entry
            if n_completed == n_jobs and group_state != "complete":
                entry[2] = "complete"
                done.append(group)
                self._w.emit([Update("job_groups", {"state": "complete",
                                                    "time_completed_ms": now},
                                     {"batch_id": b, "job_group_id": group})])
                if group == 0:
                    self._w.emit([Update("batches", {"state": "complete",
                                                     "time_completed_ms": now}, {"id": b})])
        if done:  # the outbox rows of what completed, in the same transaction (settle())
            self._done.setdefault(b, []).append((done, self._cancelled_groups(b), now))


def _job_row(r: Any) -> JobRow:
    """A cached job row from a row of ``_JOB_ROWS`` or ``_JOB_RANGE``.

    By position: a SQLAlchemy row's attribute goes through its ``__getattr__``, and fourteen
    of them were 8.6 us a row against 0.95 for the whole row unpacked (a window is 512 jobs).
    """
    (job_id, job_group_id, state, cancelled, always_run, cores_mcpu, inst_coll, n_attempts,
     n_max_attempts, attempt_id, n_pending_parents, user, billing_project, resource_usage) = r
    return JobRow(int(job_id), int(job_group_id), state, bool(cancelled), bool(always_run),
                  int(cores_mcpu), str(inst_coll), int(n_attempts), int(n_max_attempts),
                  attempt_id, int(n_pending_parents), str(user), str(billing_project),
                  resource_usage)


def _runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct ``ids`` as inclusive ranges of consecutive ids."""
    out: list[tuple[int, int]] = []
    for j in ids:
        if out and j == out[-1][1] + 1:
            out[-1] = (out[-1][0], j)
        else:
            out.append((j, j))
    return out
