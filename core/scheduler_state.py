"""The scheduler's in-memory state, rebuilt by folding the log (pure: no I/O, no clock).

:class:`SchedulerState` is *mutable*: :meth:`SchedulerState.apply` folds one event (or envelope)
in place, and :func:`evolve` is the ``evolve(state, event) -> state`` spelling of the same thing.
A frozen state would have to be copied (or made persistent) for every event, which a
10,000,000-job batch cannot afford in Python; the fold stays deterministic because ``apply``
reads nothing but the state and the event. The scheduler is the state's only owner.

Job states follow the projector (:mod:`core.projection.execution`, ``services/projector``):

- jobs of an update are held aside until ``UpdateCommitted``; then each gets its initial state
  from its parents' current states (:func:`core.projection.commit.initial_states`, re-done here
  in one streaming pass so a huge commit allocates no per-job temporaries);
- the first SJ or MJS moves a Ready job to Running (a new attempt); the first MJC, a
  ``job.cancelled`` or a lost last attempt ends a job, which then leaves memory (one byte per
  job remembers whether it succeeded, for the parents of later updates);
- ``attempt.lost`` of the current attempt returns a Running job to Ready, or ends it in Error
  after ``n_max_attempts``;
- ``Job.started`` records that the MJS of the current attempt was folded (an SJ alone leaves it
  False), so a new scheduler can re-deliver attempts that were placed but never started;
- each instance knows the attempts placed on it (``Instance.attempts``,
  :meth:`SchedulerState.running_on`);
- a parent that ends in anything but Success marks its not-``always_run`` children cancelled;
  cancelling a group cancels its descendants (the batch is group 0).

``cancel_after_n_failures`` of a batch (group 0) or job group counts the jobs of the group and
its descendants that end Failed or Error (an MJC, or a lost last attempt); cancelled jobs do not
count. A group that reaches its limit and is not cancelled yet waits in
``SchedulerState.failure_cancels`` until its cancellation is folded
(:func:`core.scheduling.failure_cancellations` turns the entries into events).

A job is *effectively cancelled* (``Job.cancel`` is set) when it is not ``always_run`` and a
parent failed or its group is cancelled. Ready jobs that are not cancelled sit in the ready queue
of (user, inst_coll) in (batch id, job id) order; cancelled Ready and Running jobs sit in their
user's cancel queue instead, and fair share never counts them. SJ events whose envelope carries a
``producer_epoch`` older than the latest ``scheduler.elected`` are ignored (fencing); bare events
are unfenced.
"""

from __future__ import annotations

import bisect
import itertools
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import msgspec

from core.job_queue import JobQueue
from schemas.base import CancelReason, CompletedJobState, JobState
from schemas.batch import (
    BatchCancelled,
    BatchCreated,
    JobGroupCancelled,
    JobGroupsSubmitted,
    JobHeadsSubmitted,
    UpdateCommitted,
)
from schemas.envelope import Envelope
from schemas.events import AnyEvent
from schemas.execution import (
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
    SchedulerElected,
)

PENDING: Final = 0
READY: Final = 1
RUNNING: Final = 2
STATE_NAMES: Final[tuple[JobState, ...]] = ("Pending", "Ready", "Running")
"""The API name of each live state code."""

_SUCCEEDED: Final = 1
_UNSUCCESSFUL: Final = 2


class Job(msgspec.Struct, gc=False):
    """A committed, unfinished job (or one held aside until its update commits).

    A struct the cyclic collector does not track (it holds ints, strings and a tuple of
    strings, so it can be in no cycle): a 1M-job commit makes a million at once, and as
    tracked objects (a slots dataclass) they set off collections that took a third of the
    commit's CPU, and 16 bytes more each.
    """

    group: int
    cores_mcpu: int
    inst_coll: str
    regions: tuple[str, ...] | None
    always_run: bool
    n_max_attempts: int
    state: int = PENDING
    n_pending: int = 0
    n_attempts: int = 0
    attempt_id: str | None = None
    instance: str | None = None
    cancel: CancelReason | None = None
    """Why the job is effectively cancelled, or None."""
    started: bool = False
    """The MJS of the current attempt was folded (False while only its SJ is known)."""


@dataclass(slots=True)
class HeldBunch:
    """A bunch of an uncommitted update, kept as columns until its commit makes its Jobs.

    A ``Job`` apiece, with its parents' tuple and its entry in a dict, was some 250 bytes a job
    held and a quarter of the scheduler's CPU through a 1M-job submission; these columns are
    about 40 bytes a job and half the work, and the rest is done once, at the commit, after the
    submission's answer.
    """

    job_ids: array[int]
    groups: array[int]
    cores_mcpu: array[int]
    inst_colls: list[str]
    regions: list[tuple[str, ...] | None] | None
    """Per job; None when no job of the bunch names regions."""
    always_run: bytes
    n_max_attempts: array[int]
    parents: list[tuple[int, ...]] | None
    """Per job; None when no job of the bunch has parents."""

    def jobs(self) -> Iterable[tuple[int, Job, tuple[int, ...]]]:
        """(job id, a fresh Job, parents) of each job, in the bunch's order."""
        regions = self.regions
        parents = self.parents
        for i, (job_id, group, cores, inst_coll, always_run, n_max) in enumerate(zip(
                self.job_ids, self.groups, self.cores_mcpu, self.inst_colls, self.always_run,
                self.n_max_attempts, strict=True)):
            yield (job_id,
                   Job(group, cores, inst_coll, None if regions is None else regions[i],
                       bool(always_run), n_max),
                   () if parents is None else parents[i])


def _runs(bunches: Iterable[HeldBunch]) -> list[HeldBunch] | None:
    """The bunches in id order, a resent one once (its last copy), or None.

    None when a bunch is not a run of consecutive increasing ids or two runs overlap.
    """
    by_first: dict[int, HeldBunch] = {}
    for b in bunches:
        ids = b.job_ids
        first, n = ids[0], len(ids)
        if ids[-1] != first + n - 1 or ids != array("q", range(first, first + n)):
            return None
        seen = by_first.get(first)
        if seen is not None and len(seen.job_ids) != n:
            return None
        by_first[first] = b
    runs = [by_first[first] for first in sorted(by_first)]
    for a, b in itertools.pairwise(runs):
        if a.job_ids[-1] >= b.job_ids[0]:
            return None
    return runs


@dataclass(slots=True)
class Batch:
    """What the scheduler keeps of a batch."""

    user: str
    cancelled: bool = False
    cancelled_groups: dict[int, CancelReason] = field(default_factory=dict)
    """Cancelled groups (descendants included) and why."""
    group_parent: dict[int, int] = field(default_factory=dict)
    committed_updates: set[int] = field(default_factory=set)
    held: dict[int, list[HeldBunch]] = field(default_factory=dict)
    """Jobs of uncommitted updates, with their parents: update -> its bunches, as received."""
    jobs: dict[int, Job] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)
    """Committed children of live jobs (only the ones still waiting for them)."""
    done: bytearray = field(default_factory=bytearray)
    """Per job id: 0 not finished (or unknown), 1 succeeded, 2 ended otherwise."""
    failure_limits: dict[int, int] = field(default_factory=dict)
    """``cancel_after_n_failures`` per group that has one (the batch's is group 0's)."""
    n_failures: dict[int, int] = field(default_factory=dict)
    """Jobs ended Failed or Error within each group that has a limit (descendants included)."""

    def outcome(self, job_id: int) -> int:
        """0, ``_SUCCEEDED`` or ``_UNSUCCESSFUL`` for a job id."""
        return self.done[job_id] if job_id < len(self.done) else 0

    def group_cancel(self, group: int) -> CancelReason | None:
        """Why ``group`` is cancelled, or None."""
        return self.cancelled_groups.get(group)


@dataclass(slots=True)
class Instance:
    """A worker instance as the scheduler sees it."""

    inst_coll: str
    region: str
    total_mcpu: int
    used_mcpu: int = 0
    active: bool = False
    deactivated: bool = False
    """Takes no new jobs until deleted (an instance neither active nor deactivated is still
    being created)."""
    attempts: dict[tuple[int, int], str] = field(default_factory=dict)
    """Attempts placed on the instance: (batch id, job id) -> attempt id."""

    @property
    def free_mcpu(self) -> int:
        """Cores not taken by attempts placed on the instance."""
        return self.total_mcpu - self.used_mcpu


UserColl = tuple[str, str]
"""(user, inst_coll)."""

K = TypeVar("K")


class SchedulerState:
    """The fold of the log the scheduler acts on. Compare states with ``==``."""

    def __init__(self) -> None:
        """An empty state (no events folded)."""
        self.epoch = 0
        self.batches: dict[int, Batch] = {}
        self.instances: dict[str, Instance] = {}
        self.ready: dict[UserColl, JobQueue] = {}
        """Ready, not cancelled jobs per (user, inst_coll)."""
        self.to_cancel: dict[str, JobQueue] = {}
        """Effectively cancelled Ready and Running jobs per user (the canceller's queue)."""
        self.ready_mcpu: dict[UserColl, int] = {}
        self.running_mcpu: dict[UserColl, int] = {}
        self.failure_cancels: set[tuple[int, int]] = set()
        """(batch id, group id) that reached ``cancel_after_n_failures`` and are not cancelled."""
        self._regions: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __eq__(self, other: object) -> bool:
        """Equal when every part of the fold is equal."""
        return isinstance(other, SchedulerState) and self._parts() == other._parts()

    __hash__ = None  # type: ignore[assignment]

    def _parts(self) -> tuple[object, ...]:
        return (self.epoch, self.batches, self.instances, _nonempty(self.ready),
                _nonempty(self.to_cancel), self.ready_mcpu, self.running_mcpu,
                self.failure_cancels)

    def job(self, batch_id: int, job_id: int) -> Job | None:
        """A committed, unfinished job, or None."""
        batch = self.batches.get(batch_id)
        return None if batch is None else batch.jobs.get(job_id)

    def running_on(self, instance_name: str) -> list[tuple[int, int, str]]:
        """The attempts placed on an instance, as sorted (batch id, job id, attempt id).

        Args:
            instance_name: The instance; an unknown (or deleted) one has none.

        Returns:
            The attempts whose SJ or MJS named the instance and that have not ended or been
            lost since.

        """
        inst = self.instances.get(instance_name)
        if inst is None:
            return []
        return sorted((b, j, a) for (b, j), a in inst.attempts.items())

    # --- folding -----------------------------------------------------------------------------
    def apply(self, item: Envelope | AnyEvent) -> None:
        """Fold one event, or one envelope (whose ``producer_epoch`` fences SJ), in place."""
        event, epoch = (item.event, item.producer_epoch) if isinstance(item, Envelope) else (
            item, None)
        match event:
            case SchedulerElected():
                self.epoch = max(self.epoch, event.epoch)
            case BatchCreated():
                if event.batch_id not in self.batches:
                    limit = event.cancel_after_n_failures
                    self.batches[event.batch_id] = Batch(
                        sys.intern(event.user), failure_limits={} if limit is None else {0: limit})
            case JobGroupsSubmitted():
                self._groups(event)
            case JobHeadsSubmitted():
                self._hold(event)
            case UpdateCommitted():
                self._commit(event.batch_id, event.update_id)
            case BatchCancelled():
                self._cancel_group(event.batch_id, 0, event.reason)
            case JobGroupCancelled():
                self._cancel_group(event.batch_id, event.job_group_id, event.reason)
            case JobScheduled():
                if epoch is None or epoch >= self.epoch:
                    self._start(event.batch_id, event.job_id, event.attempt_id,
                                event.instance_name, started=False)
            case JobsScheduled():
                if epoch is None or epoch >= self.epoch:
                    for a in event.attempts:
                        self._start(event.batch_id, a.job_id, a.attempt_id, a.instance_name,
                                    started=False)
            case JobStarted():
                self._start(event.batch_id, event.job_id, event.attempt_id, event.instance_name,
                            started=True)
            case JobCompleted():
                self._end(event.batch_id, event.job_id, event.state)
            case JobsCompleted():
                for c in event.attempts:
                    self._end(event.batch_id, c.job_id, c.state)
            case JobCancelled():
                self._end(event.batch_id, event.job_id, "Cancelled")
            case JobsCancelled():
                for job_id in event.job_ids:
                    self._end(event.batch_id, job_id, "Cancelled")
            case AttemptLost():
                self._lost(event)
            case JobUnschedulable():
                if event.permanent:
                    self._unschedulable(event.batch_id, event.job_id)
            case InstanceRequested():
                self.instances.setdefault(event.instance_name, Instance(
                    sys.intern(event.inst_coll), sys.intern(event.region), event.cores_mcpu))
            case InstanceCreated():
                self.instances.setdefault(event.instance_name,
                                          Instance(sys.intern(event.inst_coll), "", 0))
            case InstanceActivated():
                inst = self.instances.get(event.instance_name)
                if inst is not None:
                    inst.total_mcpu, inst.active, inst.deactivated = event.cores_mcpu, True, False
            case InstanceDeactivated():
                inst = self.instances.get(event.instance_name)
                if inst is not None:
                    inst.active, inst.deactivated = False, True
            case InstanceDeleted():
                # Attempts still placed on it stay Running: the service publishes AttemptLost.
                self.instances.pop(event.instance_name, None)
            case _:
                pass  # events that do not change what the scheduler acts on

    def _groups(self, event: JobGroupsSubmitted) -> None:
        batch = self.batches.get(event.batch_id)
        if batch is None or event.update_id in batch.committed_updates:
            return
        for g in event.job_groups:
            batch.group_parent[g.job_group_id] = g.parent_id
            if g.cancel_after_n_failures is not None:
                batch.failure_limits[g.job_group_id] = g.cancel_after_n_failures
            reason = batch.group_cancel(g.parent_id)
            if reason is not None:  # ingest refuses this; a race must not revive the group
                batch.cancelled_groups.setdefault(g.job_group_id, reason)

    def _hold(self, event: JobHeadsSubmitted) -> None:
        batch = self.batches.get(event.batch_id)
        if batch is None or event.update_id in batch.committed_updates:
            return
        jobs = event.jobs
        if not jobs:
            return
        resources = [j.resources for j in jobs]
        regions: list[tuple[str, ...] | None] | None = None
        if any(r.regions is not None for r in resources):
            regions = [None if r.regions is None else self._intern_regions(r.regions)
                       for r in resources]
        intern = sys.intern
        batch.held.setdefault(event.update_id, []).append(HeldBunch(
            job_ids=array("q", [j.job_id for j in jobs]),
            groups=array("q", [j.job_group_id for j in jobs]),
            cores_mcpu=array("q", [r.cores_mcpu for r in resources]),
            inst_colls=[intern(j.inst_coll) for j in jobs],
            regions=regions,
            always_run=bytes([j.always_run for j in jobs]),
            n_max_attempts=array("q", [j.n_max_attempts for j in jobs]),
            parents=([tuple(j.parent_ids) for j in jobs]
                     if any(j.parent_ids for j in jobs) else None)))

    def _intern_regions(self, regions: Iterable[str]) -> tuple[str, ...]:
        key = tuple(sorted(regions))
        return self._regions.setdefault(key, key)

    def _commit(self, batch_id: int, update_id: int) -> None:
        batch = self.batches.get(batch_id)
        if batch is None or update_id in batch.committed_updates:
            return
        batch.committed_updates.add(update_id)
        bunches = batch.held.pop(update_id, [])
        runs = _runs(bunches)
        in_update: Callable[[int], bool]
        jobs: Iterable[tuple[int, Job, tuple[int, ...]]]
        if runs is not None:
            # The usual update (ingest's bunches are runs of ids): in id order, bunch by bunch,
            # without a dict of every job (the columns are a fifth of its size).
            starts = [b.job_ids[0] for b in runs]
            ends = [b.job_ids[-1] for b in runs]

            def in_update(p: int) -> bool:
                i = bisect.bisect_right(starts, p) - 1
                return i >= 0 and p <= ends[i]

            # A bunch of independent jobs of one pool is made whole (its jobs are all Ready,
            # none waits for another): a 1M-job commit in a fifth of the CPU.
            jobs = (t for b in runs if not self._commit_ready_run(batch_id, batch, b)
                    for t in b.jobs())
        else:
            # A bunch sent again (a client's retry) holds the same jobs: the last one stands.
            held = {job_id: (job, parents) for bunch in bunches
                    for job_id, job, parents in bunch.jobs()}
            in_update = held.__contains__
            jobs = ((job_id, *held[job_id]) for job_id in sorted(held))
        for job_id, job, parents in jobs:
            failed = False
            for p in parents:
                if in_update(p) or p in batch.jobs:
                    job.n_pending += 1
                    batch.children.setdefault(p, []).append(job_id)
                    continue
                outcome = batch.outcome(p)
                if not outcome:
                    raise ValueError(f"batch {batch_id}: job {job_id} has parent {p}, "
                                     "which is not committed")
                failed = failed or outcome == _UNSUCCESSFUL
            if not job.always_run:
                job.cancel = "parent_failed" if failed else batch.group_cancel(job.group)
            job.state = READY if job.n_pending == 0 else PENDING
            batch.jobs[job_id] = job
            self._index(batch_id, batch, job_id, job)

    def _commit_ready_run(self, batch_id: int, batch: Batch, bunch: HeldBunch) -> bool:
        """Commit a bunch of independent jobs of one pool all at once, or return False.

        True for a bunch of a run whose jobs have no parents, in one pool, of a batch with no
        cancelled group; False (nothing done) for any other bunch.

        Such jobs all start Ready and not cancelled, whatever else they hold: the per-job
        rule of :meth:`_commit` (same state, same queues and counters) made a call per job,
        1.3 us a job, while the commit's CPU is what the official client waits behind at the
        end of a 1M-job submit (docs/performance.md).
        """
        inst_colls = bunch.inst_colls
        inst_coll = inst_colls[0]
        if (bunch.parents is not None or batch.cancelled_groups
                or inst_colls.count(inst_coll) != len(inst_colls)):
            return False
        regions = bunch.regions
        jobs = list(map(Job, bunch.groups, bunch.cores_mcpu, inst_colls,
                        itertools.repeat(None) if regions is None else regions,
                        map(bool, bunch.always_run), bunch.n_max_attempts,
                        itertools.repeat(READY)))
        job_ids = bunch.job_ids
        batch.jobs.update(zip(job_ids, jobs, strict=True))
        key = (batch.user, inst_coll)
        _queue(self.ready, key).add_run(batch_id, job_ids[0], len(job_ids))
        _bump(self.ready_mcpu, key, sum(bunch.cores_mcpu))
        return True

    def _cancel_group(self, batch_id: int, group: int, reason: CancelReason) -> None:
        batch = self.batches.get(batch_id)
        if batch is None:
            return
        if group == 0:
            batch.cancelled = True
        new: set[int] = set()
        for g in (0, *batch.group_parent):
            if g in batch.cancelled_groups:
                continue
            a = g
            while a != group and a in batch.group_parent:
                a = batch.group_parent[a]
            if a == group:
                new.add(g)
        if not new:
            return
        for g in new:
            batch.cancelled_groups[g] = reason
            self.failure_cancels.discard((batch_id, g))
        for job_id, job in batch.jobs.items():
            if job.cancel is None and not job.always_run and job.group in new:
                self._unindex(batch_id, batch, job_id, job)
                job.cancel = reason
                self._index(batch_id, batch, job_id, job)

    def _start(self, batch_id: int, job_id: int, attempt_id: str, instance: str, *,
               started: bool) -> None:
        """SJ (``started`` False) or MJS (True) of an attempt."""
        batch = self.batches.get(batch_id)
        job = None if batch is None else batch.jobs.get(job_id)
        if batch is None or job is None:
            return
        if job.state == RUNNING and started and job.attempt_id == attempt_id:
            job.started = True  # the MJS that follows the current attempt's SJ
            return
        if job.state != READY:
            return  # duplicates, other attempts and jobs not (yet) Ready change nothing
        self._unindex(batch_id, batch, job_id, job)
        job.state, job.attempt_id, job.instance = RUNNING, attempt_id, instance
        job.started = started
        job.n_attempts += 1
        inst = self.instances.get(instance)
        if inst is not None:
            inst.used_mcpu += job.cores_mcpu
            inst.attempts[(batch_id, job_id)] = attempt_id
        self._index(batch_id, batch, job_id, job)

    def _release(self, batch_id: int, job_id: int, job: Job) -> None:
        """The current attempt stops holding its instance's cores."""
        inst = None if job.instance is None else self.instances.get(job.instance)
        # An instance re-created under the same name never held this attempt.
        if inst is not None and inst.attempts.pop((batch_id, job_id), None) is not None:
            inst.used_mcpu -= job.cores_mcpu
        job.attempt_id = job.instance = None
        job.started = False

    def _lost(self, event: AttemptLost) -> None:
        batch = self.batches.get(event.batch_id)
        job = None if batch is None else batch.jobs.get(event.job_id)
        if batch is None or job is None or job.state != RUNNING or (
                job.attempt_id != event.attempt_id):
            return
        if job.n_attempts >= job.n_max_attempts:
            self._end(event.batch_id, event.job_id, "Error")
            return
        self._unindex(event.batch_id, batch, event.job_id, job)
        self._release(event.batch_id, event.job_id, job)
        job.state = READY
        self._index(event.batch_id, batch, event.job_id, job)

    def _end(self, batch_id: int, job_id: int, state: CompletedJobState) -> None:
        """A live job ended: it leaves memory and releases its waiting children."""
        batch = self.batches.get(batch_id)
        job = None if batch is None else batch.jobs.pop(job_id, None)
        if batch is None or job is None:
            return  # unknown, uncommitted or already ended: later MJCs are no-ops
        self._unindex(batch_id, batch, job_id, job)
        if job.state == RUNNING:
            self._release(batch_id, job_id, job)
        succeeded = state == "Success"
        if state in ("Failed", "Error"):
            self._count_failure(batch_id, batch, job.group)
        if job_id >= len(batch.done):
            batch.done.extend(bytes(max(job_id + 1, 2 * len(batch.done)) - len(batch.done)))
        batch.done[job_id] = _SUCCEEDED if succeeded else _UNSUCCESSFUL
        for child_id in batch.children.pop(job_id, ()):
            child = batch.jobs.get(child_id)
            if child is None or child.state != PENDING:
                continue
            child.n_pending = max(0, child.n_pending - 1)
            if not succeeded and not child.always_run and child.cancel is None:
                child.cancel = "parent_failed"
            if child.n_pending == 0:
                child.state = READY
                self._index(batch_id, batch, child_id, child)

    def _count_failure(self, batch_id: int, batch: Batch, group: int) -> None:
        """One more failed job in ``group`` and each of its ancestors up to the batch."""
        limits = batch.failure_limits
        if not limits:
            return
        g: int | None = group
        while g is not None:
            limit = limits.get(g)
            if limit is not None:
                n = batch.n_failures[g] = batch.n_failures.get(g, 0) + 1
                if n >= limit and g not in batch.cancelled_groups:
                    self.failure_cancels.add((batch_id, g))
            g = None if g == 0 else batch.group_parent.get(g, 0)

    def _unschedulable(self, batch_id: int, job_id: int) -> None:
        """A Ready job no worker can ever hold ends in Error (reported, never silently stuck)."""
        job = self.job(batch_id, job_id)
        if job is not None and job.state == READY:
            self._end(batch_id, job_id, "Error")

    # --- queues and fair-share counters: every change is unindex(old) + index(new) -----------
    def _index(self, batch_id: int, batch: Batch, job_id: int, job: Job) -> None:
        self._enter(batch_id, batch, job_id, job, +1)

    def _unindex(self, batch_id: int, batch: Batch, job_id: int, job: Job) -> None:
        self._enter(batch_id, batch, job_id, job, -1)

    def _enter(self, batch_id: int, batch: Batch, job_id: int, job: Job, sign: int) -> None:
        if job.state == PENDING:
            return
        user = batch.user
        if job.cancel is not None:
            _toggle(_queue(self.to_cancel, user), batch_id, job_id, sign)
            return
        key = (user, job.inst_coll)
        if job.state == RUNNING:
            _bump(self.running_mcpu, key, sign * job.cores_mcpu)
        else:
            _toggle(_queue(self.ready, key), batch_id, job_id, sign)
            _bump(self.ready_mcpu, key, sign * job.cores_mcpu)


def _bump(counter: dict[UserColl, int], key: UserColl, delta: int) -> None:
    value = counter.get(key, 0) + delta
    if value:
        counter[key] = value
    else:
        counter.pop(key, None)


def _queue(queues: dict[K, JobQueue], key: K) -> JobQueue:
    queue = queues.get(key)
    if queue is None:
        queue = queues[key] = JobQueue()
    return queue


def _toggle(queue: JobQueue, batch_id: int, job_id: int, sign: int) -> None:
    if sign > 0:
        queue.add(batch_id, job_id)
    else:
        queue.discard(batch_id, job_id)


def _nonempty(queues: Mapping[K, JobQueue]) -> dict[K, JobQueue]:
    return {k: q for k, q in queues.items() if len(q)}


def evolve(state: SchedulerState, item: Envelope | AnyEvent) -> SchedulerState:
    """Fold one event or envelope into ``state`` (in place) and return it.

    Args:
        state: The state so far; it is mutated.
        item: An event, or an envelope whose ``producer_epoch`` fences SJ.

    Returns:
        ``state`` itself.

    """
    state.apply(item)
    return state


def fold(items: Iterable[Envelope | AnyEvent]) -> SchedulerState:
    """A fresh state with ``items`` folded in order.

    Args:
        items: Events or envelopes in log order.

    Returns:
        The new state.

    """
    state = SchedulerState()
    for item in items:
        state.apply(item)
    return state
