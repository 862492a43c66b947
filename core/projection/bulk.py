"""A whole batch's history folded at once, in memory: the rebuild's fast path.

The projector folds the log event by event, reading back what earlier events wrote and
writing every state change (:mod:`services.projector.handlers`). A rebuild sees a batch's whole
history before it writes anything, so for the common lifecycle it can write each row once, in
its final state, and each counter once, as the sum of its movements:

    BatchCreated, UpdateOpened, JobsSubmitted..., UpdateCommitted, then SJ / MJS / MJC /
    heartbeats of the update's jobs, in any order and with duplicates

:func:`fold_batch` folds such a history into row operations; any other history (more than one
update, job groups, cancellations, lost attempts, execution events before the commit or of
unknown jobs, ...) gives None, and the caller folds that batch through the projector's sink.

The rules are the handlers' rules, state change by state change, on plain rows: the same pure
functions decide the initial states and the commit (:mod:`core.projection.fold`,
:mod:`core.projection.commit`), counter movements (:func:`core.projection.execution.move`) and
billing (:func:`core.billing.billable`, :func:`core.billing.usage`, :func:`core.billing.by_day`).
What differs is only the bookkeeping: a counter movement is counted by what it depends on (the
job's group, pool, cores, flags and the two states) and expanded into increments once per
distinct movement, and billed usage is summed per resource before it becomes increments. The
rebuild's audit diff compares the result with the live projection.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from core.billing import (
    DAY_MS,
    UsageTexts,
    billable,
    by_day,
    day_name,
    resources_text,
    usage_text,
)
from core.completions import completion_ops
from core.projection import billing
from core.projection.commit import (
    BatchBefore,
    StagedCounts,
    StagedJob,
    plan_commit,
    stage_counts,
)
from core.projection.counters import CANCELLABLE, JOB_COUNTS, STAGED
from core.projection.execution import JobFacts, move_into
from core.projection.fold import fold_batch_created, fold_jobs, fold_update_opened
from core.projection.instances import MINUTE_MS, RATE_KINDS
from core.projection.ops import Increment, Increments, InsertIgnore, Op, Row
from schemas.base import AttemptResource, BatchEvent, JobState
from schemas.batch import (
    BatchCreated,
    JobHeadsSubmitted,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.execution import (
    AttemptHeartbeat,
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
    RawJobCompleted,
    RawJobScheduled,
    RawJobStarted,
    decode_resources,
)

_COMPLETE = frozenset({"Success", "Failed", "Error", "Cancelled"})
_JOB_DEFAULTS: dict[str, Any] = {
    "cancelled": False, "cancel_reason": None, "exit_code": None, "attempt_id": None,
    "instance_name": None, "start_time_ms": None, "end_time_ms": None, "status": None,
    "main_start_ms": None, "main_end_ms": None, "worker_region": None,
    "n_attempts": 0, "resource_usage": None}
"""Columns of ``jobs`` that execution sets, at their table defaults (every row gets all)."""

_OWNED: dict[str, tuple[str, ...]] = {
    JOB_COUNTS: ("n_jobs", "n_pending", "n_ready", "n_creating", "n_running", "n_completed",
                 "n_succeeded", "n_failed", "n_errored", "n_cancelled"),
    CANCELLABLE: ("n_ready_cancellable_jobs", "ready_cancellable_cores_mcpu",
                  "n_running_cancellable_jobs", "running_cancellable_cores_mcpu",
                  "n_creating_cancellable_jobs"),
    STAGED: ("n_jobs", "n_ready", "ready_cores_mcpu", "n_ready_always_run",
             "ready_always_run_cores_mcpu"),
    billing.JOB_GROUP: ("resource_usage",),
    billing.BATCH: ("resource_usage",),
}
"""Counter tables keyed by the batch, with their counter columns: only the batch's own fold
writes their rows, so it inserts them once with their totals (every column, zeros included:
one statement shape per table) instead of incrementing."""

_START_KINDS: dict[type, tuple[str, ...]] = {JobScheduled: (RATE_KINDS[JobScheduled],),
                                              JobStarted: (RATE_KINDS[JobStarted],),
                                              RawJobScheduled: (RATE_KINDS[JobScheduled],),
                                              RawJobStarted: (RATE_KINDS[JobStarted],)}
_END_KINDS: dict[bool, tuple[str, ...]] = {
    True: (RATE_KINDS[JobCompleted],),
    False: (RATE_KINDS[JobStarted], RATE_KINDS[JobCompleted])}
"""The ``event_rates`` kinds of an SJ or MJS, and of an MJC by its ``start_reported``: what
:func:`core.projection.instances.rate_kinds` gives, looked up once per event."""
_RUNNABLE = frozenset({"Ready", "Creating"})

Quantities = tuple[tuple[str, int], ...]
"""What an attempt is billed for at some point (resource, quantity per ms), as a dict key."""

Timed = tuple[BatchEvent, int]
"""An event and its envelope's time (ms)."""

Resources = Sequence[AttemptResource] | msgspec.Raw
"""An attempt's resource list as an event holds it: decoded, or undecoded in the rebuild's
views (:data:`schemas.execution.RAW_VIEWS`)."""

ResourceLists = dict[bytes, Quantities]
"""Undecoded resource lists already decoded, as (resource, quantity) pairs in list order."""


class _NotFolded(Exception):
    """A history this fold does not take after all (an undecodable resource list)."""


class _Attempt:
    """An attempt's ``attempts`` row, and what it is billed for.

    A plain class (no dataclass defaults): one is made per attempt, and its ``__init__`` was a
    few percent of a lane.
    """

    __slots__ = ("quantities", "resources", "row", "seen")

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        self.resources: dict[str, int] = {}
        """What it is billed for: resource -> quantity per ms (the first quantity of each)."""
        self.seen: Resources = ()
        """The last resource list merged in: SJ, MJS and MJC of an attempt carry the same."""
        self.quantities: Quantities = ()
        """``resources`` as a key: the attempts of a batch mostly share one."""


class _Fold:
    """One batch's fold: rows by key, movements and usage summed, then operations."""

    def __init__(self, created: BatchCreated, time_ms: int, token: int,
                 resource_lists: ResourceLists | None = None) -> None:
        self.b = created.batch_id
        self.resource_lists: ResourceLists = {} if resource_lists is None else resource_lists
        self.created = created
        self.token = token
        self.ops: list[Op] = fold_batch_created(created, time_ms)
        self.batch_row = _row_of(self.ops, "batches")
        self.group_row = _row_of(self.ops, "job_groups")
        self.counts_row = _row_of(self.ops, JOB_COUNTS)
        self.update: UpdateOpened | None = None
        self.update_row: dict[str, Any] | None = None
        self.committed = False
        # Each job's ``jobs`` row being written (final values once the fold ends), and the
        # children of the jobs that have any.
        self.jobs: dict[int, dict[str, Any]] = {}
        self.children: dict[int, list[int]] = {}
        self.bunches: list[Op] = []
        # The update's jobs counted by (job group, pool, cores, always_run, parents), and how
        # many there are.
        self.staged: dict[tuple[int, str, int, bool, int], int] = {}
        self.n_staged = 0
        self.attempts: dict[tuple[int, str], _Attempt] = {}
        # (job group, pool, cores, always_run, cancelled, old, new) -> how many jobs moved so.
        self.moves: dict[tuple[int, str, int, bool, bool, JobState, JobState], int] = {}
        # Billed milliseconds by what they are billed at (usage is quantity times ms, so a sum
        # of ms per set of quantities becomes usage once, in finish): per job, per day, and for
        # the batch.
        self.job_ms: dict[int, dict[Quantities, int]] = {}
        self.day_ms: dict[tuple[str, Quantities], int] = {}
        self.batch_ms: dict[Quantities, int] = {}
        self.rates: dict[tuple[int, tuple[str, ...]], int] = {}  # (minute, kinds) -> events
        self.n_jobs = 0
        self.n_completed = 0
        self.done_at: int | None = None

    # --- submission ---------------------------------------------------------------------
    def opened(self, event: UpdateOpened, time_ms: int) -> bool:
        if self.update is not None:
            return False
        self.update = event
        ops = fold_update_opened(event, time_ms)
        self.update_row = _row_of(ops, "batch_updates")
        self.ops += ops
        return True

    def submitted(self, event: JobHeadsSubmitted) -> bool:
        if self.update is None or event.update_id != self.update.update_id:
            return False
        if self.committed:
            return True  # a client's retry after the commit: its jobs were all in
        new = [j for j in event.jobs if j.job_id not in self.jobs]
        if not new:
            return True
        ops = fold_jobs(event, new, extra=_JOB_DEFAULTS)
        rows = _rows_of(ops, "jobs")
        jobs = self.jobs
        # Counted by what staging needs of a job (as stage_jobs would), in the same pass.
        staged: dict[tuple[int, str, int, bool, int], int] = {}
        with_parents = []
        for j, row in zip(new, rows, strict=True):
            jobs[j.job_id] = row
            key = (j.job_group_id, j.inst_coll, row["cores_mcpu"], j.always_run,
                   len(j.parent_ids))
            staged[key] = staged.get(key, 0) + 1
            if j.parent_ids:
                with_parents.append(j)
        if len(jobs) != self.n_staged + len(new):
            return False  # a job twice in the bunch: not this path's history
        self.n_staged = len(jobs)
        self.bunches += ops
        self.ops += stage_counts(self.b, event.update_id,
                                 {StagedJob(*key): n for key, n in staged.items()})
        for key, n in staged.items():
            self.staged[key] = self.staged.get(key, 0) + n
        for j in with_parents:
            if len(set(j.parent_ids)) != len(j.parent_ids):
                return False  # one edge per parent in job_parents, but every id counted
            for p in j.parent_ids:
                if p not in self.jobs:
                    return False  # a parent outside the update: not this path's history
                self.children.setdefault(p, []).append(j.job_id)
        return True

    def commit(self, event: UpdateCommitted, time_ms: int) -> bool:
        if self.update is None or event.update_id != self.update.update_id:
            return False
        if self.committed:
            return True  # a duplicate request
        self.committed = True
        # The jobs' rows are as submitted until the commit (execution before it is not this
        # path's), so their counts are those staged with them.
        staged: dict[tuple[int, str], list[int]] = {}
        for (g, ic, cores, always_run, n_parents), n in self.staged.items():
            counts = staged.setdefault((g, ic), [0, 0, 0, 0, 0])
            counts[0] += n
            if not n_parents:
                counts[1] += n
                counts[2] += n * cores
                if always_run:
                    counts[3] += n
                    counts[4] += n * cores
        if any(g != 0 for g, _ in staged):
            return False  # jobs in groups the batch does not have: not this path's history
        plan = plan_commit(
            batch=BatchBefore(self.b, self.created.user, 0, 0, None),
            staged=[StagedCounts(g, ic, *c) for (g, ic), c in sorted(staged.items())],
            resolved=[], cancelled_groups=frozenset(), ancestors={0: [0]}, update_groups=[],
            token=self.token, now_ms=time_ms)
        self.ops += plan.increments
        self.batch_row.update(plan.batch.values)
        for group in plan.groups:
            self.group_row.update(group.values)
        assert self.update_row is not None
        self.update_row.update(committed=True, time_committed_ms=time_ms)
        self.n_jobs = len(self.jobs)
        if self.n_jobs == 0:
            self.done_at = time_ms
        return True

    # --- execution ----------------------------------------------------------------------
    # Each returns False for an event not of this path's history (about a job the batch does
    # not have, or before the commit), and counts the event's ``event_rates`` kinds.
    def start(self, event: JobScheduled | JobStarted | RawJobScheduled | RawJobStarted,
              time_ms: int) -> bool:
        """An SJ or an MJS."""
        row = self.jobs.get(event.job_id)
        if row is None or not self.committed:
            return False
        rates = self.rates
        key = (time_ms // MINUTE_MS, _START_KINDS[type(event)])
        rates[key] = rates.get(key, 0) + 1
        attempt_id = event.attempt_id
        att = self._attempt(row["job_id"], attempt_id, event.instance_name, event.resources)
        started = (event.start_time_ms
                   if type(event) is RawJobStarted or type(event) is JobStarted else None)
        if started is not None:
            att.row["start_time_ms"] = started
        state = row["state"]
        if state in _RUNNABLE:
            self._move(row, state, "Running")
            row["state"] = "Running"
            row["attempt_id"] = attempt_id
            row["instance_name"] = event.instance_name
            row["n_attempts"] += 1
            if started is not None:
                row["start_time_ms"] = started
        elif started is not None and row["attempt_id"] == attempt_id:
            row["start_time_ms"] = started
        return True

    def completed(self, event: JobCompleted | RawJobCompleted, time_ms: int) -> bool:
        """An MJC."""
        row = self.jobs.get(event.job_id)
        if row is None or not self.committed:
            return False
        rates = self.rates
        key = (time_ms // MINUTE_MS, _END_KINDS[event.start_reported])
        rates[key] = rates.get(key, 0) + 1
        attempt_id = event.attempt_id
        att = self._attempt(row["job_id"], attempt_id, event.instance_name, event.resources)
        start, end = event.start_time_ms, event.end_time_ms
        self._bill(row["job_id"], att, end, start_ms=start, end_ms=end)
        a = att.row
        a["start_time_ms"] = start
        a["end_time_ms"] = end
        if row["state"] not in _COMPLETE:
            self._end(row, event.state, time_ms)
            row["exit_code"] = event.exit_code
            row["status"] = event.status
            row["main_start_ms"] = event.main_start_ms
            row["main_end_ms"] = event.main_end_ms
            row["worker_region"] = event.region
            row["start_time_ms"] = start
            row["end_time_ms"] = end
            row["attempt_id"] = attempt_id
            row["instance_name"] = event.instance_name
        return True

    def heartbeat(self, event: AttemptHeartbeat, time_ms: int) -> bool:
        if event.job_id not in self.jobs or not self.committed:
            return False
        att = self.attempts.get((event.job_id, event.attempt_id))
        if att is not None:
            self._bill(event.job_id, att, event.rollup_time_ms)
        return True

    def _attempt(self, job_id: int, attempt_id: str, instance: str,
                 resources: Resources) -> _Attempt:
        att = self.attempts.get((job_id, attempt_id))
        if att is None:
            att = self.attempts[(job_id, attempt_id)] = _Attempt({
                "batch_id": self.b, "job_id": job_id, "attempt_id": attempt_id,
                "instance_name": instance, "start_time_ms": None, "end_time_ms": None,
                "rollup_time_ms": None, "reason": None, "resources": None})
        if resources != att.seen:  # undecoded lists compare as bytes
            pairs = self._pairs(resources)
            if pairs and not att.resources:  # the attempt's first list: nearly always its only
                att.resources = merged = dict(pairs)
                # The pairs are the key as they are unless a resource repeats (the first wins).
                att.quantities = pairs if len(merged) == len(pairs) else tuple(merged.items())
            elif pairs:
                merged = att.resources
                for resource, quantity in pairs:
                    if resource not in merged:
                        merged[resource] = quantity
                att.quantities = tuple(merged.items())
            att.seen = resources
        return att

    def _pairs(self, resources: Resources) -> Quantities:
        """A resource list's (resource, quantity) pairs, in order.

        An undecoded list is decoded once per distinct list (``_NotFolded`` if it is not one).
        """
        if type(resources) is not msgspec.Raw:
            return tuple((r.resource, r.quantity) for r in resources)
        key = bytes(resources)
        pairs = self.resource_lists.get(key)
        if pairs is None:
            try:
                decoded = decode_resources(resources)
            except msgspec.DecodeError as e:  # the sink's path decodes it and says where
                raise _NotFolded from e
            pairs = self.resource_lists[key] = tuple((r.resource, r.quantity) for r in decoded)
        return pairs

    def _attempt_rows(self) -> list[Row]:
        """The attempts' rows with their ``resources`` column.

        A batch's attempts mostly share one resource list: each distinct one is rendered once.
        """
        texts: dict[Quantities, str | None] = {}
        rows: list[Row] = []
        for att in self.attempts.values():
            key = att.quantities
            if key not in texts:
                texts[key] = resources_text(att.resources)
            att.row["resources"] = texts[key]
            rows.append(att.row)
        return rows

    def _move(self, row: dict[str, Any], old: JobState, new: JobState) -> None:
        cancelled = not row["always_run"] and row["cancelled"]
        key = (row["job_group_id"], row["inst_coll"], row["cores_mcpu"], row["always_run"],
               cancelled, old, new)
        self.moves[key] = self.moves.get(key, 0) + 1

    def _bill(self, job_id: int, att: _Attempt, to_ms: int, *, start_ms: int | None = None,
              end_ms: int | None = None) -> None:
        if not att.resources:
            return
        a = att.row
        start = a["start_time_ms"] if a["start_time_ms"] is not None else start_ms
        end = a["end_time_ms"] if a["end_time_ms"] is not None else end_ms
        interval = billable(start, a["rollup_time_ms"], end, to_ms)
        if interval is None:
            return
        lo, hi = interval
        a["rollup_time_ms"] = hi
        ms = hi - lo
        if ms <= 0:
            return
        # Milliseconds summed by the quantities they are billed at: usage (quantity times ms)
        # is made per resource once per job, day and batch in finish, not per interval.
        quantities = att.quantities
        job_ms = self.job_ms.get(job_id)
        if job_ms is None:
            job_ms = self.job_ms[job_id] = {}
        job_ms[quantities] = job_ms.get(quantities, 0) + ms
        self.batch_ms[quantities] = self.batch_ms.get(quantities, 0) + ms
        day_ms = self.day_ms
        first_day = lo // DAY_MS
        if (hi - 1) // DAY_MS == first_day:  # within one UTC day: most intervals
            key = (day_name(first_day), quantities)
            day_ms[key] = day_ms.get(key, 0) + ms
        else:
            for day, day_lo, day_hi in by_day(lo, hi):
                key = (day.isoformat(), quantities)
                day_ms[key] = day_ms.get(key, 0) + day_hi - day_lo

    def _end(self, row: dict[str, Any], state: JobState, time_ms: int) -> None:
        self._move(row, row["state"], state)
        row["state"] = state
        self.n_completed += 1
        failed = state != "Success"
        for c in self.children.get(row["job_id"], ()):
            child = self.jobs[c]
            if child["state"] != "Pending":
                continue
            flag = failed and not child["always_run"]
            pending = max(0, child["n_pending_parents"] - 1)
            new: JobState = "Ready" if pending == 0 else "Pending"
            if flag:
                child.update(cancelled=True, cancel_reason="parent_failed")
            self._move(child, "Pending", new)
            child.update(n_pending_parents=pending, state=new)
        if self.n_completed == self.n_jobs and self.done_at is None:
            self.done_at = time_ms

    # --- output -------------------------------------------------------------------------
    def finish(self) -> list[Op]:
        acc = Increments()
        for inc in self.ops:
            if isinstance(inc, Increment):
                acc.add(inc)
        ops: list[Op] = [op for op in self.ops if not isinstance(op, Increment)]
        ops += self.bunches
        user = self.created.user
        for (g, ic, cores, always_run, cancelled, old, new), times in self.moves.items():
            facts = JobFacts(self.b, 0, g, user, ic, cores, always_run, cancelled)
            move_into(acc, facts, old, new, [0], self.token, times)
        if self.attempts:
            ops.append(InsertIgnore("attempts", self._attempt_rows()))
        jobs, texts = self.jobs, UsageTexts()
        for j, job_ms in self.job_ms.items():
            if len(job_ms) == 1:  # one set of quantities: nearly every job
                ((quantities, ms),) = job_ms.items()
                # Its text is rendered where it is written (a load has MariaDB render it).
                jobs[j]["resource_usage"] = texts.usage(quantities, ms)
            else:
                jobs[j]["resource_usage"] = usage_text(_usage(job_ms))
        # Keys as an Increment's items (drain puts them in one order), without an Increment
        # made per row and merged.
        bp, t, b, bump = self.created.billing_project, self.token, self.b, acc.bump
        for resource, amount in _usage(self.batch_ms).items():
            bump(billing.JOB_GROUP, (("batch_id", b), ("job_group_id", 0),
                                     ("resource", resource), ("token", t)),
                 "resource_usage", amount)
            bump(billing.BATCH, (("batch_id", b), ("resource", resource), ("token", t)),
                 "resource_usage", amount)
            bump(billing.BILLING_PROJECT, (("billing_project", bp), ("resource", resource),
                                           ("token", t)), "resource_usage", amount)
            bump(billing.USER, (("user", user), ("resource", resource), ("token", t)),
                 "resource_usage", amount)
        for (day, quantities), ms in self.day_ms.items():
            for resource, quantity in quantities:
                bump(billing.BILLING_PROJECT_USER_DATE, (
                    ("billing_project", bp), ("user", user), ("usage_date", day),
                    ("resource", resource), ("token", t)), "resource_usage", quantity * ms)
        for (minute, kinds), n in self.rates.items():
            for kind in kinds:
                bump("event_rates", (("minute", minute), ("kind", kind), ("token", t)), "n", n)
        shared: list[Op] = []
        owned: dict[str, list[Row]] = {}
        for inc in acc.drain():
            columns = _OWNED.get(inc.table)
            if columns is None:
                shared.append(inc)
            elif inc.table == JOB_COUNTS and inc.key["job_group_id"] == 0:
                self.counts_row.update(inc.deltas)
            else:
                owned.setdefault(inc.table, []).append(
                    {**inc.key, **{c: inc.deltas.get(c, 0) for c in columns}})
        for c in _OWNED[JOB_COUNTS]:
            self.counts_row.setdefault(c, 0)
        ops += [InsertIgnore(table, rows) for table, rows in owned.items()]
        if self.done_at is not None:
            done = {"state": "complete", "time_completed_ms": self.done_at}
            self.batch_row.update(done)
            self.group_row.update(done)
            counts = self.counts_row
            ops += completion_ops(self.b, [(0, counts["n_jobs"], counts["n_succeeded"],
                                            counts["n_failed"], counts["n_cancelled"])],
                                  frozenset(), self.done_at)
        return ops + shared


def fold_batch(events: Sequence[Timed], token: int, *,
               resource_lists: ResourceLists | None = None) -> list[Op] | None:
    """The operations that project one batch's whole history, or None.

    None: the history is not the common lifecycle this fold covers (see the module docstring),
    or an undecoded resource list of it is not one.

    Args:
        events: every event of the batch on its partition, in log order, with their times.
            SJ, MJS and MJC may be their views with undecoded resources.
        token: the partition's counter token.
        resource_lists: undecoded resource lists decoded so far, shared by the folds of a
            partition (added to); by default, this fold's own.

    """
    if not events or not isinstance(events[0][0], BatchCreated) or events[0][0].empty:
        return None
    created, time_ms = events[0]
    assert isinstance(created, BatchCreated)
    fold = _Fold(created, time_ms, token, resource_lists)
    # By exact type (a bunch is either class: see JobHeadsSubmitted): one lookup per event.
    step: dict[type, Callable[[Any, int], bool]] = {
        UpdateOpened: fold.opened, JobsSubmitted: lambda e, _: fold.submitted(e),
        JobHeadsSubmitted: lambda e, _: fold.submitted(e),
        UpdateCommitted: fold.commit, JobScheduled: fold.start, JobStarted: fold.start,
        RawJobScheduled: fold.start, RawJobStarted: fold.start,
        JobsScheduled: lambda e, t: all(fold.start(sj, t) for sj in e.expand()),
        JobCompleted: fold.completed, RawJobCompleted: fold.completed,
        AttemptHeartbeat: fold.heartbeat,
        JobsCompleted: lambda e, t: all(fold.completed(mjc, t) for mjc in e.expand())}
    try:
        for event, t in events[1:]:
            handle = step.get(type(event))
            if handle is None or not handle(event, t):
                return None
    except _NotFolded:
        return None
    return fold.finish()


def _usage(ms_by_quantities: dict[Quantities, int]) -> dict[str, int]:
    """Usage per resource (quantity times ms) of milliseconds summed by their quantities."""
    if len(ms_by_quantities) == 1:  # a job's one attempt, a batch's one machine type
        ((quantities, ms),) = ms_by_quantities.items()
        return {resource: quantity * ms for resource, quantity in quantities}
    usage: dict[str, int] = {}
    for quantities, ms in ms_by_quantities.items():
        for resource, quantity in quantities:
            usage[resource] = usage.get(resource, 0) + quantity * ms
    return usage


def _rows_of(ops: Sequence[Op], table: str) -> list[dict[str, Any]]:
    for op in ops:
        if isinstance(op, InsertIgnore) and op.table == table:
            return [_mutable(r) for r in op.rows]
    raise LookupError(f"no insert into {table}")


def _row_of(ops: Sequence[Op], table: str) -> dict[str, Any]:
    (row,) = _rows_of(ops, table)
    return row


def _mutable(row: Row) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise TypeError(f"rows are dicts, not {type(row).__name__}")
    return row
