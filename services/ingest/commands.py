"""Write commands: validate with the core, allocate ids, append events, wait for the projector.

A command never touches projection tables. It reads them to validate (after read-your-writes,
they reflect every write this client saw acknowledged), appends events for one batch in one
ordered publish (one partition key), then waits, bounded, until the projector applied them.

Job bunches and the commit of an update whose every job this process appended are the
exceptions: they are answered once the log holds them (a bunch, while the projector is less than
``bunch_slack`` records short of it), so a big submission is not paced by the projection. Their
positions are kept as *unsettled*, and a read of that batch first waits, bounded, until the
projector applied them: the client still reads its writes (:meth:`Commands.settle`).

The specs of a ``JobsSubmitted`` bunch go to the :class:`SpecStore` before the event is
published (a worker may be handed the job as soon as the event is read); if they cannot be
stored the request fails with a 503 and nothing is published.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from core.billing import cost_str, over_limit
from core.errors import BadRequest, Forbidden, NotFound, Unavailable
from core.id_tally import IdTally
from core.job_bunch import job_records_json
from core.job_specs import job_records
from core.resources import InstCollConfig
from core.specs import (
    BatchSpec,
    job_group_records,
    parse_batch_spec,
    parse_create_fast,
    parse_update_fast,
    parse_update_spec,
)
from schemas.batch import (
    BatchCancelled,
    BatchCancelRequested,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupCancelRequested,
    JobGroupRecord,
    JobGroupsSubmitted,
    JobRecord,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.events import AnyEvent
from schemas.topics import BATCH
from services.common.log import LogPosition, Publisher
from services.common.specstore import SpecStore
from services.ingest import metrics as ingest_metrics
from services.ingest.store import Store, User

log = logging.getLogger(__name__)

CANCELLED_BATCH = "Cannot submit new jobs or job groups to a cancelled batch"
BUNCH_SLACK = 512
"""How many records of its partition the projector may still be short of a job bunch when the
bunch request is answered: the bound on how far the projection of big submissions lags (512
bunches of the official client's 1,024 jobs: about ten seconds of projector work here)."""
UPDATE_CHECK_TTL_S = 1.0
"""How long a job bunch may reuse the check of its (batch, update, user) that an earlier bunch
made: a big submission's bunches each queried MariaDB, busy with the projection, on their
critical path. The commit checks afresh, and this process's own cancel or commit drops the
entry; a cancel through another process is seen within this bound, which only widens the race
between a bunch's check and its append that any cancel has (such a bunch is never committed)."""
_UNSETTLED_KEPT = 10_000
_TALLIES_KEPT = 1_000


class Commands:
    """The write side of the API."""

    def __init__(self, store: Store, publisher: Publisher, config: InstCollConfig,
                 *, wait_s: float = 15.0, specs: SpecStore | None = None,
                 bunch_slack: int = BUNCH_SLACK,
                 update_check_ttl_s: float = UPDATE_CHECK_TTL_S) -> None:
        self.store = store
        self.publisher = publisher
        self.config = config
        self.wait_s = wait_s
        # None stores no specs (tests of the API alone): workers then need them inline.
        self.specs = specs
        self.bunch_slack = bunch_slack
        self._frozen_at: tuple[float, bool] = (-1e9, False)
        # Per batch (most recent only): its user and the last position this process appended
        # and answered before the projector applied it.
        self._unsettled: OrderedDict[int, tuple[str, LogPosition]] = OrderedDict()
        # Per open update (most recent only): the ids of its jobs this process appended; None
        # once this process committed the update.
        self._tallies: OrderedDict[tuple[int, int], IdTally | None] = OrderedDict()
        # Per (batch, update, user): when a bunch last found the update open, and its row.
        self.update_check_ttl_s = update_check_ttl_s
        self._checked: OrderedDict[tuple[int, int, str], tuple[float, Any]] = OrderedDict()
        self._checked_lock = threading.Lock()

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _store_specs(self, batch_id: int, records: Sequence[JobRecord]) -> None:
        await asyncio.to_thread(self._write_specs, batch_id, records)

    def _write_specs(self, batch_id: int, records: Sequence[JobRecord],
                     body: bytes | None = None) -> None:
        """Write a bunch's specs to the spec store; 503 (nothing published) if that fails.
        ``body``: the records carry no spec texts, and this JSON array (checked) holds them."""
        if self.specs is None or not records:
            return
        try:
            # The records' ids are contiguous (core.job_specs checks).
            if body is None:
                self.specs.write_run(batch_id, records[0].job_id, [r.spec for r in records])
            else:
                self.specs.write_json(batch_id, records[0].job_id, body)
        except OSError as e:
            log.exception("storing the specs of batch %d failed", batch_id)
            raise Unavailable(f"could not store the job specs: {type(e).__name__}: {e}; "
                              "try again") from e

    async def _append(self, events: Sequence[AnyEvent], *, slack: int = 0,
                      unsettled: tuple[int, str] | None = None) -> list[LogPosition]:
        """Publish ``events`` in order, then wait (bounded) until the projector is at most
        ``slack`` records short of them. With ``unsettled`` (batch id, user), an answer given
        before they were applied is remembered for the reads of that batch to wait on."""
        positions = await self.publisher.publish_many(list(events))
        ingest_metrics.appended(len(positions))
        applied = await self.store.wait_applied(positions, timeout_s=self.wait_s, slack=slack)
        if unsettled is not None and positions and (slack or not applied):
            batch_id, user = unsettled
            self._unsettled[batch_id] = (user, positions[-1])
            self._unsettled.move_to_end(batch_id)
            while len(self._unsettled) > _UNSETTLED_KEPT:
                self._unsettled.popitem(last=False)
        return positions

    async def settle(self, batch_id: int | None, user: str) -> None:
        """Read-your-writes for writes answered early: wait, bounded, until the projector
        applied what this process appended to the batch (to every batch of ``user`` when
        ``batch_id`` is None) and answered before it was applied."""
        if batch_id is not None:
            entry = self._unsettled.get(batch_id)
            pending = [] if entry is None else [(batch_id, entry[1])]
        else:
            pending = [(b, p) for b, (u, p) in self._unsettled.items() if u == user]
        if not pending:
            return
        if await self.store.wait_applied([p for _, p in pending], timeout_s=self.wait_s):
            for b, p in pending:
                if self._unsettled.get(b, (None, None))[1] == p:
                    del self._unsettled[b]

    # --- checks ---------------------------------------------------------------------------
    async def _check_not_frozen(self) -> None:
        """Submissions are refused while an operator froze the service (cached for 2 s)."""
        checked_at, frozen = self._frozen_at
        now = time.monotonic()
        if now - checked_at > 2.0:
            frozen = await self._db(self.store.frozen)
            self._frozen_at = (now, frozen)
        if frozen:
            raise Unavailable("the batch service is frozen for maintenance: try again later")

    async def _check_billing_project(self, name: str, user: User) -> None:
        found = await self._db(self.store.billing_project, name, user.name)
        if found is None or not found[1]:
            raise Forbidden(f"Unknown Hail Batch billing project {name}.")
        if found[0] != "open":
            raise Forbidden(f"Billing project {name} is closed or deleted.")
        await self._check_budget(name)

    async def _check_budget(self, name: str) -> None:
        """A billing project at or over its limit takes no new work (the reference's 403)."""
        budget = await self._db(self.store.budget, name)
        if budget is not None and over_limit(budget[1], budget[0]):
            limit, accrued = budget
            raise Forbidden(f"billing project {name} has exceeded the budget; "
                            f"accrued={cost_str(accrued)} limit={cost_str(limit)}")

    async def _found(self, batch_id: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a thread; a :class:`NotFound` it raises is believed once the
        projector applied what this process appended to the batch and answered early.

        A write is answered after at most ``wait_s`` with its event on the log, maybe not yet
        projected (the projector far behind, say after a big cancellation): the client's next
        write to that batch or update must not be told that it does not exist. Those appends
        not applied in time are a 503, which clients retry.
        """
        try:
            return await self._db(fn, *args)
        except NotFound as e:
            entry = self._unsettled.get(batch_id)
            if entry is None:
                raise
            if not await self.store.wait_applied([entry[1]], timeout_s=self.wait_s):
                raise Unavailable(f"{e}: it may still be on its way (the projection is behind "
                                  "the log); try again") from e
            return await self._db(fn, *args)

    def _visible(self, batch_id: int, user: User) -> Any:
        """The batch's row, if ``user`` may see it (blocking); else :class:`NotFound`."""
        row = self.store.visible_batch(batch_id, user.name)
        if row is None:
            raise NotFound(f"batch {batch_id} not found")
        return row

    async def _open_batch(self, batch_id: int, user: User) -> Any:
        row = await self._found(batch_id, self._visible, batch_id, user)
        return self._check_open(batch_id, row)

    @staticmethod
    def _check_open(batch_id: int, row: Any) -> Any:
        if row.cancelled:
            raise BadRequest(CANCELLED_BATCH)
        return row

    async def _open_update(self, batch_id: int, update_id: int, user: User) -> Any:
        return await self._found(batch_id, self._checked_update, batch_id, update_id, user,
                                 self._committed_here(batch_id, update_id))

    def _committed_here(self, batch_id: int, update_id: int) -> bool:
        """Whether this process committed the update (maybe not projected yet)."""
        return self._tallies.get((batch_id, update_id), 0) is None

    def _checked_update(self, batch_id: int, update_id: int, user: User,
                        committed_here: bool) -> Any:
        """The row of an update of a visible, uncancelled batch, still open (blocking)."""
        found = self.store.batch_and_update(batch_id, update_id, user.name)
        if found is None:
            raise NotFound(f"batch {batch_id} not found")
        cancelled, update = found
        if cancelled:
            raise BadRequest(CANCELLED_BATCH)
        if update is None:
            raise NotFound(f"update {update_id} of batch {batch_id} not found")
        if update.committed or committed_here:
            raise BadRequest(f"update {update_id} is already committed")
        return update

    def _bunch_update(self, batch_id: int, update_id: int, user: User,
                      committed_here: bool) -> Any:
        """:meth:`_checked_update`, or its answer to an earlier bunch of the same update and
        user within ``update_check_ttl_s`` (blocking; called from several threads)."""
        key = (batch_id, update_id, user.name)
        now = time.monotonic()
        with self._checked_lock:
            hit = self._checked.get(key)
        if hit is not None and not committed_here and now - hit[0] < self.update_check_ttl_s:
            return hit[1]
        u = self._checked_update(batch_id, update_id, user, committed_here)
        if self.update_check_ttl_s > 0:
            with self._checked_lock:
                self._checked[key] = (now, u)
                while len(self._checked) > _TALLIES_KEPT:
                    self._checked.popitem(last=False)
        return u

    def _forget_checks(self, batch_id: int) -> None:
        """Bunches of ``batch_id`` check afresh (this process cancelled or committed)."""
        with self._checked_lock:
            for key in [k for k in self._checked if k[0] == batch_id]:
                del self._checked[key]

    def _lookup(self, batch_id: int) -> Callable[[int], tuple[int, bool, bool] | None]:
        """(depth, committed, cancelled) of a group, asked of the database once per group."""
        cache: dict[int, tuple[int, bool, bool] | None] = {}

        def lookup(group: int) -> tuple[int, bool, bool] | None:
            if group not in cache:
                cache[group] = self.store.groups(batch_id, [group]).get(group)
            return cache[group]
        return lookup

    def _depth_of(self, batch_id: int) -> Callable[[int], int | None]:
        lookup = self._lookup(batch_id)

        def depth(group: int) -> int | None:
            if group == 0:  # the root exists from creation (even before create-fast projects)
                return 0
            found = lookup(group)
            if found is not None and found[2]:
                raise BadRequest(f"job group {group} is cancelled: it takes no new job groups")
            return None if found is None else found[0]
        return depth

    def _known_group(self, batch_id: int, new_groups: Sequence[int] = ()
                     ) -> Callable[[int], bool]:
        fresh = set(new_groups)
        lookup = self._lookup(batch_id)

        def known(group: int) -> bool:
            if group in fresh:
                return True
            found = lookup(group)
            if found is not None and found[2]:
                raise BadRequest(f"job group {group} is cancelled: it takes no new jobs")
            return found is not None or group == 0
        return known

    async def _allocate_update(self, batch_id: int, n_jobs: int, n_groups: int
                               ) -> tuple[int, int, int]:
        update_id = await self._db(self.store.allocate, f"batch:{batch_id}:update", 1)
        start_job = await self._db(self.store.allocate, f"batch:{batch_id}:job", n_jobs)
        start_group = await self._db(self.store.allocate, f"batch:{batch_id}:group", n_groups)
        return update_id, start_job, start_group

    def _records(self, batch_id: int, groups: Any, jobs: Any, *, start_job: int, n_jobs: int,
                 start_group: int, n_groups: int, user: User
                 ) -> tuple[list[JobGroupRecord], list[JobRecord]]:
        group_records = job_group_records(groups, start_job_group_id=start_group,
                                          n_job_groups=n_groups,
                                          depth_of=self._depth_of(batch_id)) if groups else []
        job_recs = job_records(
            jobs, start_job_id=start_job, n_jobs=n_jobs, start_job_group_id=start_group,
            n_job_groups=n_groups, config=self.config,
            known_group=self._known_group(batch_id, [g.job_group_id for g in group_records]),
            is_developer=user.is_developer, batch_id=batch_id) if jobs else []
        return group_records, job_recs

    # --- batches ----------------------------------------------------------------------------
    async def _existing(self, spec: BatchSpec, user: User) -> tuple[int, Any] | None:
        batch_id = await self._db(self.store.batch_id_by_token, user.name, spec.token)
        if batch_id is None:
            return None
        return batch_id, await self._db(self.store.update_by_token, batch_id, spec.token)

    def _batch_created(self, batch_id: int, spec: BatchSpec, user: User, *,
                       empty: bool = False) -> BatchCreated:
        return BatchCreated(batch_id=batch_id, user=user.name,
                            billing_project=spec.billing_project, token=spec.token,
                            attributes=spec.attributes, callback=spec.callback,
                            cancel_after_n_failures=spec.cancel_after_n_failures, empty=empty)

    async def create_batch(self, body: Any, user: User) -> dict[str, Any]:
        await self._check_not_frozen()
        spec = parse_batch_spec(body)
        await self._check_billing_project(spec.billing_project, user)
        existing = await self._existing(spec, user)
        if existing is not None:
            batch_id, update = existing
            return {"id": batch_id, "update_id": None if update is None else update.update_id,
                    "start_job_group_id": None if update is None else update.start_job_group_id,
                    "start_job_id": None if update is None else update.start_job_id}
        batch_id = await self._db(self.store.allocate, "batch", 1)
        empty = not (spec.n_jobs or spec.n_job_groups)
        events: list[AnyEvent] = [self._batch_created(batch_id, spec, user, empty=empty)]
        out: dict[str, Any] = {"id": batch_id, "update_id": None, "start_job_group_id": None,
                               "start_job_id": None}
        if spec.n_jobs or spec.n_job_groups:
            update_id, start_job, start_group = await self._allocate_update(
                batch_id, spec.n_jobs, spec.n_job_groups)
            events.append(UpdateOpened(batch_id=batch_id, update_id=update_id, token=spec.token,
                                       n_jobs=spec.n_jobs, n_job_groups=spec.n_job_groups,
                                       start_job_id=start_job, start_job_group_id=start_group))
            out |= {"update_id": update_id, "start_job_group_id": start_group,
                    "start_job_id": start_job}
        await self._append(events, unsettled=(batch_id, user.name))
        winner = await self._db(self.store.batch_id_by_token, user.name, spec.token)
        if winner is not None and winner != batch_id:  # a concurrent create with this token won
            return await self.create_batch(body, user)
        return out

    async def create_fast(self, body: Any, user: User) -> dict[str, Any]:
        await self._check_not_frozen()
        spec, groups, jobs = parse_create_fast(body)
        await self._check_billing_project(spec.billing_project, user)
        existing = await self._existing(spec, user)
        if existing is not None and existing[1] is not None and existing[1].committed:
            update = existing[1]
            return {"id": existing[0], "start_job_group_id": update.start_job_group_id,
                    "start_job_id": update.start_job_id}
        if existing is not None:
            batch_id = existing[0]
            update = existing[1]
            events: list[AnyEvent] = []
        else:
            batch_id = await self._db(self.store.allocate, "batch", 1)
            update = None
            events = [self._batch_created(batch_id, spec, user)]
        if update is None:
            update_id, start_job, start_group = await self._allocate_update(
                batch_id, spec.n_jobs, spec.n_job_groups)
            events.append(UpdateOpened(batch_id=batch_id, update_id=update_id, token=spec.token,
                                       n_jobs=spec.n_jobs, n_job_groups=spec.n_job_groups,
                                       start_job_id=start_job, start_job_group_id=start_group))
        else:
            update_id, start_job, start_group = (update.update_id, update.start_job_id,
                                                 update.start_job_group_id)
        events += await self._bunch_events(batch_id, update_id, groups, jobs, start_job,
                                           spec.n_jobs, start_group, spec.n_job_groups, user)
        await self._append(events, unsettled=(batch_id, user.name))
        return {"id": batch_id, "start_job_group_id": start_group, "start_job_id": start_job}

    async def _bunch_events(self, batch_id: int, update_id: int, groups: Any, jobs: Any,
                            start_job: int, n_jobs: int, start_group: int, n_groups: int,
                            user: User) -> list[AnyEvent]:
        group_records, job_recs = await self._db(
            self._records, batch_id, groups, jobs, start_job=start_job, n_jobs=n_jobs,
            start_group=start_group, n_groups=n_groups, user=user)
        if len(group_records) != n_groups:
            raise BadRequest(f"wrong number of job groups: expected {n_groups}, "
                             f"actual {len(group_records)}")
        if len(job_recs) != n_jobs:
            raise BadRequest(f"wrong number of jobs: expected {n_jobs}, actual {len(job_recs)}")
        events: list[AnyEvent] = []
        if group_records:
            events.append(JobGroupsSubmitted(batch_id=batch_id, update_id=update_id,
                                             job_groups=group_records))
        if job_recs:
            await self._store_specs(batch_id, job_recs)
            events.append(JobsSubmitted(batch_id=batch_id, update_id=update_id, jobs=job_recs))
        events.append(UpdateCommitted(batch_id=batch_id, update_id=update_id, n_jobs=n_jobs,
                                      n_job_groups=n_groups))
        return events

    async def update_fast(self, batch_id: int, body: Any, user: User) -> dict[str, Any]:
        await self._check_not_frozen()
        update_spec, groups, jobs = parse_update_fast(body)
        batch = await self._open_batch(batch_id, user)
        await self._check_budget(str(batch.billing_project))
        update = await self._db(self.store.update_by_token, batch_id, update_spec.token)
        if update is not None and update.committed:
            return {"update_id": update.update_id, "start_job_id": update.start_job_id,
                    "start_job_group_id": update.start_job_group_id}
        events: list[AnyEvent] = []
        if update is None:
            update_id, start_job, start_group = await self._allocate_update(
                batch_id, update_spec.n_jobs, update_spec.n_job_groups)
            events.append(UpdateOpened(batch_id=batch_id, update_id=update_id,
                                       token=update_spec.token, n_jobs=update_spec.n_jobs,
                                       n_job_groups=update_spec.n_job_groups,
                                       start_job_id=start_job, start_job_group_id=start_group))
        else:
            update_id, start_job, start_group = (update.update_id, update.start_job_id,
                                                 update.start_job_group_id)
        events += await self._bunch_events(batch_id, update_id, groups, jobs, start_job,
                                           update_spec.n_jobs, start_group,
                                           update_spec.n_job_groups, user)
        await self._append(events, unsettled=(batch_id, user.name))
        return {"update_id": update_id, "start_job_id": start_job,
                "start_job_group_id": start_group}

    async def open_update(self, batch_id: int, body: Any, user: User) -> dict[str, Any]:
        await self._check_not_frozen()
        spec = parse_update_spec(body)
        batch = await self._open_batch(batch_id, user)
        await self._check_budget(str(batch.billing_project))
        update = await self._db(self.store.update_by_token, batch_id, spec.token)
        if update is None:
            update_id, start_job, start_group = await self._allocate_update(
                batch_id, spec.n_jobs, spec.n_job_groups)
            await self._append([UpdateOpened(
                batch_id=batch_id, update_id=update_id, token=spec.token, n_jobs=spec.n_jobs,
                n_job_groups=spec.n_job_groups, start_job_id=start_job,
                start_job_group_id=start_group)], unsettled=(batch_id, user.name))
        else:
            update_id, start_job, start_group = (update.update_id, update.start_job_id,
                                                 update.start_job_group_id)
        return {"update_id": update_id, "start_job_group_id": start_group,
                "start_job_id": start_job}

    async def submit_groups(self, batch_id: int, update_id: int, body: Any, user: User) -> None:
        await self._check_not_frozen()
        u = await self._open_update(batch_id, update_id, user)
        records = await self._db(lambda: job_group_records(
            body, start_job_group_id=u.start_job_group_id, n_job_groups=u.n_job_groups,
            depth_of=self._depth_of(batch_id)))
        if records:
            await self._append([JobGroupsSubmitted(batch_id=batch_id, update_id=update_id,
                                                   job_groups=records)],
                               unsettled=(batch_id, user.name))

    async def submit_jobs(self, batch_id: int, update_id: int, body: bytes,
                          user: User) -> None:
        """Append a bunch of jobs of an open update, given as its JSON body."""
        await self._check_not_frozen()
        # The checks, the decode and the spec store's write in one hop to a thread: each hop
        # costs a thread switch and a wakeup of the loop, under the GIL the other requests'
        # decodes hold (three hops were a third of a bunch request's time, measured).
        u, records, specs = await self._found(batch_id, self._accepted_bunch, batch_id,
                                              update_id, body, user,
                                              self._committed_here(batch_id, update_id))
        if records:
            # Nothing reads an uncommitted update's jobs: the answer need not wait until the
            # projector applied this bunch, only until it is at most bunch_slack records short
            # of it. The commit knows the bunch is in the log from the tally.
            await self._append(
                [JobsSubmitted(batch_id=batch_id, update_id=update_id, jobs=records,
                               specs=specs)],
                slack=self.bunch_slack, unsettled=(batch_id, user.name))
            key = (batch_id, update_id)
            tally = self._tallies.get(key)
            if key not in self._tallies:
                tally = self._tallies[key] = IdTally(u.start_job_id, u.n_jobs)
                while len(self._tallies) > _TALLIES_KEPT:
                    self._tallies.popitem(last=False)
            if tally is not None:  # the records' ids are contiguous (core.job_specs checks)
                tally.add_run(records[0].job_id, records[-1].job_id + 1)

    def _accepted_bunch(self, batch_id: int, update_id: int, body: bytes, user: User,
                        committed_here: bool) -> tuple[Any, list[JobRecord], str]:
        """The update's row, the bunch's records (without spec texts) and its specs as one
        JSON text (the body, once checked), stored (blocking)."""
        u = self._bunch_update(batch_id, update_id, user, committed_here)
        records = job_records_json(
            body, start_job_id=u.start_job_id, n_jobs=u.n_jobs,
            start_job_group_id=u.start_job_group_id, n_job_groups=u.n_job_groups,
            config=self.config, known_group=self._known_group(batch_id),
            is_developer=user.is_developer, batch_id=batch_id, texts=False)
        if not records:
            return u, records, ""
        self._write_specs(batch_id, records, body)
        # Checked as JSON: every string in it was decoded as UTF-8, the rest is ASCII.
        return u, records, str(body, "utf-8")

    async def commit(self, batch_id: int, update_id: int, user: User) -> dict[str, Any]:
        await self._check_not_frozen()
        u = await self._open_update(batch_id, update_id, user)
        key = (batch_id, update_id)
        tally = self._tallies.get(key)
        n_jobs, n_groups = await self._db(self.store.update_counts, batch_id, update_id)
        # Groups are answered once applied, so the projection's group count is complete; the
        # jobs are, without waiting for the projector, when this process appended them all.
        early = tally is not None and tally.complete and n_groups == u.n_job_groups
        if early:
            n_jobs = u.n_jobs
        if (n_jobs, n_groups) != (u.n_jobs, u.n_job_groups):
            own = self._unsettled.get(batch_id)
            if own is not None:  # this process appended bunches: wait for those first
                await self.store.wait_applied([own[1]], timeout_s=self.wait_s)
                n_jobs, n_groups = await self._db(self.store.update_counts, batch_id, update_id)
        if (n_jobs, n_groups) != (u.n_jobs, u.n_job_groups):
            n_jobs, n_groups = await self._counts_once_projected(batch_id, update_id)
        if n_groups != u.n_job_groups:
            raise BadRequest(f"wrong number of job groups: expected {u.n_job_groups}, "
                             f"actual {n_groups}")
        if n_jobs != u.n_jobs:
            raise BadRequest(f"wrong number of jobs: expected {u.n_jobs}, actual {n_jobs}")
        self._forget_checks(batch_id)
        if early:
            # Every bunch is in the log before this commit (same partition): the projector
            # finds them all. The answer waits only for the append; reads settle.
            await self._append([UpdateCommitted(batch_id=batch_id, update_id=update_id,
                                                n_jobs=n_jobs, n_job_groups=n_groups)],
                               slack=self.bunch_slack, unsettled=(batch_id, user.name))
            self._tallies[key] = None
        else:
            await self._append([UpdateCommitted(batch_id=batch_id, update_id=update_id,
                                                n_jobs=n_jobs, n_job_groups=n_groups)],
                               unsettled=(batch_id, user.name))
        return {"start_job_id": u.start_job_id, "start_job_group_id": u.start_job_group_id}

    async def _counts_once_projected(self, batch_id: int, update_id: int) -> tuple[int, int]:
        """The update's job and group counts once the projector applied all the log holds.

        A job bunch's request is answered once the projector is at most ``bunch_slack``
        records short of it, and any request after at most ``wait_s``: counts short of the
        update's may only mean that some accepted bunch is not applied yet. That is told apart
        from a client that sent too few by waiting (bounded) for the projector to reach the
        end of every partition of the batch topic; when it cannot in time, the commit is
        refused with a 503 (a retryable error: the client's retry finds the counts complete).
        """
        ends = await self.publisher.ends([BATCH])
        caught_up = await self.store.wait_applied(
            [LogPosition(topic, partition, end - 1)
             for (topic, partition), end in ends.items() if end > 0], timeout_s=self.wait_s)
        if not caught_up:
            raise Unavailable(f"update {update_id} of batch {batch_id} is not fully projected "
                              "yet: try the commit again")
        counts: tuple[int, int] = await self._db(self.store.update_counts, batch_id, update_id)
        return counts

    # --- cancellation and deletion ----------------------------------------------------------
    async def cancel_batch(self, batch_id: int, user: User) -> None:
        await self._found(batch_id, self._visible, batch_id, user)
        self._forget_checks(batch_id)
        await self._append([BatchCancelRequested(batch_id=batch_id, requested_by=user.name),
                            BatchCancelled(batch_id=batch_id, reason="user")],
                           unsettled=(batch_id, user.name))

    async def cancel_group(self, batch_id: int, group_id: int, user: User) -> None:
        if group_id == 0:
            return await self.cancel_batch(batch_id, user)
        await self._found(batch_id, self._visible, batch_id, user)
        found = (await self._db(self.store.groups, batch_id, [group_id])).get(group_id)
        if found is None or not found[1]:
            raise Forbidden(f"job group {group_id} of batch {batch_id} does not exist")
        self._forget_checks(batch_id)
        await self._append([
            JobGroupCancelRequested(batch_id=batch_id, job_group_id=group_id,
                                    requested_by=user.name),
            JobGroupCancelled(batch_id=batch_id, job_group_id=group_id, reason="user")],
            unsettled=(batch_id, user.name))

    async def delete_batch(self, batch_id: int, user: User) -> None:
        row = await self._found(batch_id, self._visible, batch_id, user)
        self._forget_checks(batch_id)
        events: list[AnyEvent] = []
        if row.state != "complete" and not row.cancelled:
            events += [BatchCancelRequested(batch_id=batch_id, requested_by=user.name,
                                            reason="deleted"),
                       BatchCancelled(batch_id=batch_id, reason="deleted")]
        events.append(BatchDeleted(batch_id=batch_id, requested_by=user.name))
        await self._append(events, unsettled=(batch_id, user.name))
