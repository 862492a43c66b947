"""The ingest service's database access: reads of the projections, and id allocation.

Ingest never writes projection tables. It writes one table of its own, ``id_sequences``,
to reserve batch ids and each batch's blocks of update, job and group ids (an update reserves
its block when it opens, so concurrent updates never collide and jobs can name each other
before they exist). Reads check visibility: a batch is visible to members of its billing
project, unless deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

import sqlalchemy as sa

from services.common.log import LogPosition


@dataclass(frozen=True)
class User:
    name: str
    is_developer: bool


_TOKEN = sa.text(
    "SELECT u.name, u.is_developer FROM auth_tokens t JOIN users u ON u.name = t.user "
    "WHERE t.token_hash = :h AND NOT t.revoked AND NOT u.deleted "
    "AND (t.expires_at_ms IS NULL OR t.expires_at_ms > :now)")
_SEQ_INIT = sa.text("INSERT INTO id_sequences (name, next_value) VALUES (:n, :first) "
                    "ON DUPLICATE KEY UPDATE name = name")
_SEQ_LOCK = sa.text("SELECT next_value FROM id_sequences WHERE name = :n FOR UPDATE")
_SEQ_BUMP = sa.text("UPDATE id_sequences SET next_value = next_value + :count WHERE name = :n")
_APPLIED_ALL = sa.text("SELECT topic, kafka_partition, next_offset FROM applied_offsets "
                       "WHERE consumer = :c")
POLL_FIRST_S = 0.002
"""Read-your-writes: the first poll after a wait starts or another ends."""
POLL_MAX_S = 0.02
"""... each poll that ends no wait waiting half again as long as the last, up to this."""
# The attempt whose logs a job shows: the one the job row names (running, or the one that decided
# its state), else the most recently started one, else one that never started.
_LATEST_ATTEMPT = sa.text(
    "SELECT a.attempt_id, a.start_time_ms IS NOT NULL FROM attempts a "
    "JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id "
    "WHERE a.batch_id = :b AND a.job_id = :j "
    "ORDER BY (a.attempt_id <=> j.attempt_id) DESC, a.start_time_ms IS NULL, "
    "a.start_time_ms DESC, a.attempt_id DESC LIMIT 1")
_VISIBLE = (
    "FROM batches b JOIN billing_project_users m ON m.billing_project = b.billing_project "
    "AND m.user = :user WHERE b.id = :b AND NOT b.deleted")
_VISIBLE_BATCH = sa.text(
    "SELECT b.id, b.user, b.billing_project, b.token, b.attributes, b.state, b.n_jobs, "
    "b.time_created_ms, b.time_closed_ms, b.time_completed_ms, "
    "(SELECT COUNT(*) FROM batches_cancelled bc WHERE bc.batch_id = b.id) AS cancelled, "
    "b.callback, b.cancel_after_n_failures " + _VISIBLE)
_UPDATE = sa.text(
    "SELECT update_id, token, start_job_id, n_jobs, start_job_group_id, n_job_groups, "
    "committed FROM batch_updates WHERE batch_id = :b AND update_id = :u")
_BATCH_AND_UPDATE = sa.text(
    "SELECT (SELECT COUNT(*) FROM batches_cancelled bc WHERE bc.batch_id = b.id) AS cancelled, "
    "u.update_id, u.token, u.start_job_id, u.n_jobs, u.start_job_group_id, u.n_job_groups, "
    "u.committed FROM batches b JOIN billing_project_users m ON m.billing_project = "
    "b.billing_project AND m.user = :user LEFT JOIN batch_updates u ON u.batch_id = b.id "
    "AND u.update_id = :u WHERE b.id = :b AND NOT b.deleted")


class _UpdateRow(NamedTuple):
    """An update's row as :data:`_UPDATE` reads it."""

    update_id: int
    token: str
    start_job_id: int
    n_jobs: int
    start_job_group_id: int
    n_job_groups: int
    committed: bool


@dataclass(eq=False)
class _Waiter:
    """A request waiting for the projector: the last offset it needs applied per partition."""

    last: dict[tuple[str, int], int]
    done: asyncio.Future[bool]


class Store:
    """Synchronous database access for ingest (handlers call it in a worker thread), and the
    read-your-writes wait (on the event loop)."""

    def __init__(self, engine: sa.Engine, projector_consumer: str) -> None:
        self.engine = engine
        self.projector_consumer = projector_consumer
        self._waiters: set[_Waiter] = set()
        self._poller: asyncio.Task[None] | None = None
        self._poll_conn: sa.Connection | None = None
        # The highest applied offset each poll saw, per (topic, partition): a lower bound of
        # the projector's progress, which only moves forward while this process runs.
        self._seen: dict[tuple[str, int], int] = {}

    def rows(self, sql: sa.TextClause | str, **params: Any) -> Sequence[Any]:
        stmt = sa.text(sql) if isinstance(sql, str) else sql
        with self.engine.connect() as conn:
            return conn.execute(stmt, params).all()

    def one(self, sql: sa.TextClause | str, **params: Any) -> Any | None:
        found = self.rows(sql, **params)
        return found[0] if found else None

    # --- authentication -------------------------------------------------------------------
    def user_for_token_hash(self, token_hash: str) -> User | None:
        row = self.one(_TOKEN, h=token_hash, now=time.time_ns() // 1_000_000)
        return None if row is None else User(str(row[0]), bool(row[1]))

    # --- id allocation ----------------------------------------------------------------------
    def allocate(self, name: str, count: int, *, first: int = 1) -> int:
        """Reserve ``count`` consecutive ids of sequence ``name``; return the first."""
        with self.engine.begin() as conn:
            conn.execute(_SEQ_INIT, {"n": name, "first": first})
            start = int(conn.execute(_SEQ_LOCK, {"n": name}).scalar_one())
            conn.execute(_SEQ_BUMP, {"n": name, "count": count})
        return start

    # --- read-your-writes -------------------------------------------------------------------
    def applied_offsets(self) -> dict[tuple[str, int], int]:
        """The next offset the projector will apply, per (topic, partition): one query.

        Read on a connection the poller keeps while requests wait (no pool checkout and
        liveness ping per poll); each read ends its transaction, so the next sees later
        commits. A failed read drops the connection: the next poll opens a fresh one.
        """
        conn = self._poll_conn
        if conn is None:
            conn = self._poll_conn = self.engine.connect()
        try:
            rows = conn.execute(_APPLIED_ALL, {"c": self.projector_consumer}).all()
            conn.rollback()
        except Exception:
            self._close_poll_conn()
            raise
        return {(str(t), int(p)): int(n) for t, p, n in rows}

    def _close_poll_conn(self) -> None:
        conn, self._poll_conn = self._poll_conn, None
        if conn is not None:
            conn.close()

    async def wait_applied(self, positions: Sequence[LogPosition], *,
                           timeout_s: float = 15.0, slack: int = 0) -> bool:
        """Wait until the projector has applied every position (bounded); False on timeout.

        With ``slack``, until it is at most that many records of each partition short of them;
        such a wait (pacing, not read-your-writes) ends at once when an earlier poll already saw
        the projector that far, with no query. Every waiting request shares one poller (one
        query per poll, however many wait); a database error while polling fails every waiter
        with it.
        """
        last: dict[tuple[str, int], int] = {}
        for p in positions:
            last[(p.topic, p.partition)] = max(last.get((p.topic, p.partition), -1),
                                               p.offset - slack)
        last = {k: v for k, v in last.items() if v >= 0}
        if not last or (slack and self._reached(self._seen, last)):
            return True
        waiter = _Waiter(last, asyncio.get_running_loop().create_future())
        self._waiters.add(waiter)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            # Not wait_for: on Python 3.11 it returns the result, dropping the caller's
            # cancellation, when the future is done as the caller is cancelled.
            async with asyncio.timeout(timeout_s):
                return await waiter.done
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)

    @staticmethod
    def _reached(applied: dict[tuple[str, int], int], last: dict[tuple[str, int], int]) -> bool:
        return all(applied.get(k, -1) > offset for k, offset in last.items())

    async def _poll(self) -> None:
        """Poll while anyone waits: soon after a wait ends (the projector is applying), then
        backing off; the connection is given back when nobody waits."""
        try:
            while True:
                delay = POLL_FIRST_S
                while True:
                    await asyncio.sleep(delay)
                    if not self._waiters:
                        break
                    try:
                        applied = await asyncio.to_thread(self.applied_offsets)
                    except Exception as e:
                        for w in self._waiters:
                            if not w.done.done():
                                w.done.set_exception(e)
                        continue
                    for k, offset in applied.items():
                        if offset > self._seen.get(k, -1):
                            self._seen[k] = offset
                    reached = False
                    for w in self._waiters:
                        if not w.done.done() and self._reached(applied, w.last):
                            w.done.set_result(True)
                            reached = True
                    delay = POLL_FIRST_S if reached else min(delay * 1.5, POLL_MAX_S)
                await asyncio.to_thread(self._close_poll_conn)
                if not self._waiters:  # none came while the connection was given back
                    return
        finally:
            self._close_poll_conn()  # cancelled (shutdown): give it back here

    # --- operator switches ------------------------------------------------------------------
    def frozen(self) -> bool:
        row = self.one("SELECT enabled FROM feature_flags WHERE name = 'frozen'")
        return bool(row[0]) if row is not None else False

    # --- batches ----------------------------------------------------------------------------
    def batch_id_by_token(self, user: str, token: str) -> int | None:
        row = self.one("SELECT id FROM batches WHERE user = :u AND token = :t", u=user, t=token)
        return None if row is None else int(row[0])

    def visible_batch(self, batch_id: int, user: str) -> Any | None:
        return self.one(_VISIBLE_BATCH, b=batch_id, user=user)

    def update(self, batch_id: int, update_id: int) -> Any | None:
        return self.one(_UPDATE, b=batch_id, u=update_id)

    def batch_and_update(self, batch_id: int, update_id: int, user: str
                         ) -> tuple[bool, Any | None] | None:
        """Whether the batch is cancelled, and its update's row (None if it has none such);
        None if ``user`` sees no such batch. One query: a job bunch asks it."""
        with self.engine.connect() as conn:
            row = conn.execute(_BATCH_AND_UPDATE,
                               {"b": batch_id, "u": update_id, "user": user}).first()
        if row is None:
            return None
        update = None if row.update_id is None else _UpdateRow(*row[1:])
        return bool(row.cancelled), update

    def update_by_token(self, batch_id: int, token: str) -> Any | None:
        return self.one(
            "SELECT update_id, token, start_job_id, n_jobs, start_job_group_id, n_job_groups, "
            "committed FROM batch_updates WHERE batch_id = :b AND token = :t", b=batch_id, t=token)

    def update_counts(self, batch_id: int, update_id: int) -> tuple[int, int]:
        # The projector stages the update's job counts as it projects its bunches: a few rows,
        # where counting the jobs themselves would read every one of them.
        (jobs,) = self.rows("SELECT COALESCE(SUM(n_jobs), 0) FROM batch_update_job_counts "
                            "WHERE batch_id = :b AND update_id = :u", b=batch_id, u=update_id)
        (groups,) = self.rows("SELECT COUNT(*) FROM job_groups WHERE batch_id = :b AND "
                              "update_id = :u", b=batch_id, u=update_id)
        return int(jobs[0]), int(groups[0])

    def groups(self, batch_id: int, ids: Sequence[int]) -> dict[int, tuple[int, bool, bool]]:
        """(depth, committed, cancelled) of the groups among ``ids`` that exist."""
        if not ids:
            return {}
        stmt = sa.text(
            "SELECT g.job_group_id, g.depth, g.committed, "
            "(SELECT COUNT(*) FROM job_groups_cancelled c WHERE c.batch_id = g.batch_id "
            " AND c.job_group_id = g.job_group_id) FROM job_groups g "
            "WHERE g.batch_id = :b AND g.job_group_id IN :ids").bindparams(
            sa.bindparam("ids", expanding=True))
        return {int(g): (int(d), bool(c), bool(x))
                for g, d, c, x in self.rows(stmt, b=batch_id, ids=list(ids))}

    def billing_project(self, name: str, user: str) -> tuple[str, bool] | None:
        """(status, is_member) of a billing project, or None if unknown."""
        row = self.one(
            "SELECT p.status, (SELECT COUNT(*) FROM billing_project_users m WHERE "
            "m.billing_project = p.name AND m.user = :u) FROM billing_projects p "
            "WHERE p.name = :n", n=name, u=user)
        return None if row is None else (str(row[0]), bool(row[1]))

    def budget(self, name: str) -> tuple[Decimal, Decimal] | None:
        """(limit, accrued cost) of a billing project that has a limit, else None."""
        row = self.one(
            "SELECT p.limit_usd, (SELECT COALESCE(SUM(a.resource_usage * r.rate), 0) FROM "
            "aggregated_billing_project_resources a JOIN resources r ON r.resource = a.resource "
            "WHERE a.billing_project = p.name) FROM billing_projects p "
            "WHERE p.name = :n AND p.limit_usd IS NOT NULL", n=name)
        return None if row is None else (Decimal(row[0]), Decimal(row[1]))

    # --- attempts ---------------------------------------------------------------------------
    def latest_attempt(self, batch_id: int, job_id: int) -> tuple[str, bool] | None:
        """The attempt whose logs the job shows (see ``_LATEST_ATTEMPT``) and whether it
        started, None if the job has none."""
        row = self.one(_LATEST_ATTEMPT, b=batch_id, j=job_id)
        return None if row is None else (str(row[0]), bool(row[1]))
