"""What the projector keeps of its batches between transactions.

Each batch's projection rows have exactly one writer: the projector instance that owns the
batch's partition (invariant 3). So what it loaded or wrote stays true until it writes again,
and a running batch's job rows, attempts, children and group progress need not be read back
for every transaction. A :class:`PartitionCache` holds them per partition, each cached value
kept in step with every operation the handler emits on it. It is dropped whole when a
transaction fails (its changes never reached the database) or the partition is assigned anew
(another instance may have written meanwhile), and it forgets the least recently used batches
beyond a bound on cached jobs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from core.id_tally import IdTally
from schemas.base import JobState

MAX_OPEN_UPDATES = 10_000
"""Open updates whose projected jobs a partition's cache knows (a few runs of ids each)."""
DEFAULT_MAX_JOBS = 1_000_000
"""Cached jobs, over all of a projector's partitions, before least recently used batches are
forgotten (a job costs a few hundred bytes here)."""


@dataclass(slots=True)
class JobRow:
    """The columns of a committed job that execution events read (and change)."""

    job_id: int
    job_group_id: int
    state: JobState
    cancelled: bool
    always_run: bool
    cores_mcpu: int
    inst_coll: str
    n_attempts: int
    n_max_attempts: int
    attempt_id: str | None
    n_pending_parents: int
    user: str
    billing_project: str
    resource_usage: str | None = None
    """Its usage so far as ``jobs.resource_usage`` holds it (``core.billing.usage_text``)."""


@dataclass(slots=True)
class AttemptRow:
    """An attempt's billing clock and what it is billed for (resource -> quantity per ms)."""

    start_time_ms: int | None = None
    rollup_time_ms: int | None = None
    end_time_ms: int | None = None
    resources: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class BatchState:
    """What the projector knows of one batch: loaded rows, kept in step with its writes."""

    jobs: dict[int, JobRow | None] = field(default_factory=dict)
    """Rows by job id (None: not committed, or not there); children may be here unloaded."""
    loaded: set[int] = field(default_factory=set)
    """Jobs whose row, attempts and children are all here."""
    attempts: dict[tuple[int, str], AttemptRow] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)
    cancelled: frozenset[int] | None = None
    progress: dict[int, list[Any]] = field(default_factory=dict)
    """Group -> [n_jobs, n_completed, state]."""
    ancestry: dict[int, list[int]] = field(default_factory=dict)
    """Group -> the group and its ancestors up to 0 (immutable once the group exists)."""


class PartitionCache:
    """The batches of one partition, least recently used first (see the module docstring)."""

    def __init__(self) -> None:
        self._batches: OrderedDict[int, BatchState] = OrderedDict()
        self.open_updates: OrderedDict[tuple[int, int], IdTally] = OrderedDict()
        """(batch, update) -> the ids of its jobs projected, for updates opened (new) under
        this cache: every bunch of theirs since went through it. Only bunches change it (the
        handler keeps it in step); the commit ends it. Not dropped with its batch's state."""

    def open_update(self, batch_id: int, update_id: int, tally: IdTally) -> None:
        """Remember a new update's projected jobs (the oldest beyond a bound are forgotten)."""
        self.open_updates[(batch_id, update_id)] = tally
        while len(self.open_updates) > MAX_OPEN_UPDATES:
            self.open_updates.popitem(last=False)

    def get(self, batch_id: int) -> BatchState:
        """The batch's state (empty if nothing is known of it yet), now most recently used."""
        st = self._batches.get(batch_id)
        if st is None:
            st = self._batches[batch_id] = BatchState()
        else:
            self._batches.move_to_end(batch_id)
        return st

    def drop(self, batch_id: int) -> None:
        """Forget one batch (an event changed it in ways only the database now tells)."""
        self._batches.pop(batch_id, None)

    def clear(self) -> None:
        self._batches.clear()
        self.open_updates.clear()

    def trim(self, max_jobs: int) -> None:
        """Forget least recently used batches while more than ``max_jobs`` jobs are cached
        (the most recently used batch is kept whatever its size)."""
        total = sum(len(st.jobs) for st in self._batches.values())
        while total > max_jobs and len(self._batches) > 1:
            _, st = self._batches.popitem(last=False)
            total -= len(st.jobs)

    def __len__(self) -> int:
        return len(self._batches)
