"""All of the completions service's SQL: the outbox, callback deliveries and status documents.

The service owns two pieces of state: ``completions_outbox.published_ms`` and the
``callback_deliveries`` table. Everything else it only reads. Status documents come from the
ingest read code (:class:`services.ingest.reads.Reads`), so a callback carries exactly the shape
``GET /batches/{id}`` (or the job group's GET) returns; the dispatcher acts for the batch's owner,
so it sees every batch that is not deleted, whoever is a member of its billing project now.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from core.completions import AfterAttempt, Completion, as_of_completion
from core.errors import NotFound
from services.ingest.reads import Reads
from services.ingest.store import Store

_UNPUBLISHED = sa.text(
    "SELECT batch_id, job_group_id, n_jobs, outcome, n_succeeded, n_failed, n_cancelled, "
    "time_completed_ms FROM completions_outbox WHERE published_ms IS NULL "
    # A batch's groups before the batch itself when they completed together.
    "ORDER BY time_completed_ms, batch_id, job_group_id = 0, job_group_id LIMIT :n")
_PUBLISHED = sa.text(
    "UPDATE completions_outbox SET published_ms = :now WHERE batch_id = :b "
    "AND job_group_id = :g AND n_jobs = :n AND published_ms IS NULL")
_TARGET = sa.text(
    "SELECT b.callback AS batch_callback, g.callback AS group_callback, b.deleted "
    "FROM batches b JOIN job_groups g ON g.batch_id = b.id WHERE b.id = :b "
    "AND g.job_group_id = :g")
_ADD = sa.text(
    "INSERT INTO callback_deliveries (idempotency_key, batch_id, job_group_id, url, payload, "
    "status, attempts, next_attempt_ms, time_created_ms) VALUES (:key, :b, :g, :url, :payload, "
    "'pending', 0, :now, :now) ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key")
_DUE = sa.text(
    "SELECT idempotency_key, batch_id, job_group_id, url, payload, attempts, next_attempt_ms "
    "FROM callback_deliveries WHERE status = 'pending' AND next_attempt_ms <= :now "
    "ORDER BY next_attempt_ms LIMIT :n")
# When the sender must look again: the earliest pending delivery, claimed ones included (a
# claim's time is when it expires).
_NEXT_DUE = sa.text(
    "SELECT MIN(next_attempt_ms) FROM callback_deliveries WHERE status = 'pending'")
# Claiming is optimistic: another dispatcher that claimed the row first changed next_attempt_ms.
_CLAIM = sa.text(
    "UPDATE callback_deliveries SET attempts = attempts + 1, next_attempt_ms = :until "
    "WHERE idempotency_key = :key AND status = 'pending' AND next_attempt_ms = :seen")
_RESULT = sa.text(
    "UPDATE callback_deliveries SET status = :status, next_attempt_ms = :next, "
    "last_error = COALESCE(:error, last_error), time_delivered_ms = :delivered "
    "WHERE idempotency_key = :key AND status = 'pending' AND attempts = :attempts")
_DELIVERY = sa.text(
    "SELECT idempotency_key, batch_id, job_group_id, url, payload, status, attempts, "
    "next_attempt_ms, last_error, time_created_ms, time_delivered_ms "
    "FROM callback_deliveries WHERE idempotency_key = :key")
_BACKLOG = sa.text(
    "SELECT (SELECT COUNT(*) FROM completions_outbox WHERE published_ms IS NULL), "
    "(SELECT COUNT(*) FROM callback_deliveries WHERE status = 'pending')")
ERROR_CHARS = 2_000


class _AnyMemberStore(Store):
    """Ingest's store, but a batch is visible whoever asks, as long as it is not deleted."""

    def visible_batch(self, batch_id: int, user: str) -> Any | None:
        return self.one(
            "SELECT b.*, (SELECT COUNT(*) FROM batches_cancelled bc WHERE bc.batch_id = b.id) "
            "AS cancelled FROM batches b WHERE b.id = :b AND NOT b.deleted", b=batch_id)


@dataclass(frozen=True)
class NewDelivery:
    """A callback owed for a completion: where to POST, and the body (a status document)."""

    completion: Completion
    url: str
    payload: str


@dataclass(frozen=True)
class Delivery:
    """A claimed delivery: ``attempt`` is the number of the attempt about to be made."""

    key: str
    batch_id: int
    job_group_id: int
    url: str
    payload: str
    attempt: int


@dataclass(frozen=True)
class Claimed:
    """What :meth:`CompletionsStore.claim_due` claimed, and when the earliest delivery still
    pending after it is due (a claim's expiry included; None: nothing pending)."""

    deliveries: list[Delivery]
    next_due_ms: int | None


class CompletionsStore:
    """Synchronous database access (the service calls it in worker threads)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._reads = Reads(_AnyMemberStore(engine, projector_consumer=""))

    # --- the outbox ---------------------------------------------------------------------------
    def unpublished(self, limit: int) -> list[Completion]:
        """Up to ``limit`` completions not yet on the topic, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(_UNPUBLISHED, {"n": limit}).all()
        return [Completion(int(r.batch_id), int(r.job_group_id), int(r.n_jobs), r.outcome,
                           int(r.n_succeeded), int(r.n_failed), int(r.n_cancelled),
                           int(r.time_completed_ms)) for r in rows]

    def mark_published(self, completions: Sequence[Completion], now_ms: int) -> None:
        if not completions:
            return
        with self.engine.begin() as conn:
            conn.execute(_PUBLISHED, [{"b": c.batch_id, "g": c.job_group_id, "n": c.n_jobs,
                                       "now": now_ms} for c in completions])

    # --- deliveries ---------------------------------------------------------------------------
    def new_delivery(self, c: Completion) -> NewDelivery | None:
        """The callback a completion owes, or None: no callback URL, or the batch is deleted
        (as in the reference, a deleted batch calls nobody back) or unknown here."""
        with self.engine.connect() as conn:
            target = conn.execute(_TARGET, {"b": c.batch_id, "g": c.job_group_id}).first()
        if target is None or target.deleted:
            return None
        url = target.batch_callback if c.job_group_id == 0 else target.group_callback
        if not url:
            return None
        try:
            status = (self._reads.batch(c.batch_id, "") if c.job_group_id == 0
                      else self._reads.group(c.batch_id, c.job_group_id, ""))
        except NotFound:
            return None  # deleted between the two reads
        return NewDelivery(c, str(url), json.dumps(as_of_completion(status, c)))

    @staticmethod
    def add_deliveries(conn: sa.Connection, deliveries: Sequence[NewDelivery],
                       now_ms: int) -> None:
        """Insert pending deliveries, due now; one that exists already is left alone."""
        if deliveries:
            conn.execute(_ADD, [{
                "key": d.completion.key, "b": d.completion.batch_id,
                "g": d.completion.job_group_id, "url": d.url, "payload": d.payload,
                "now": now_ms} for d in deliveries])

    def claim_due(self, now_ms: int, limit: int, claim_ms: int) -> Claimed:
        """Claim up to ``limit`` due deliveries: count the attempt and hold them ``claim_ms``.

        A claim that is never resolved (the process died mid-POST) expires, and the delivery is
        due again: at least once. Also says when to look next (:class:`Claimed`).
        """
        claimed: list[Delivery] = []
        with self.engine.begin() as conn:
            for r in conn.execute(_DUE, {"now": now_ms, "n": limit}).all():
                got = conn.execute(_CLAIM, {"key": r.idempotency_key, "until": now_ms + claim_ms,
                                            "seen": r.next_attempt_ms})
                if got.rowcount == 1:
                    claimed.append(Delivery(str(r.idempotency_key), int(r.batch_id),
                                            int(r.job_group_id), str(r.url),
                                            str(r.payload or "null"), int(r.attempts) + 1))
            next_due = conn.execute(_NEXT_DUE).scalar()
        return Claimed(claimed, None if next_due is None else int(next_due))

    def record(self, results: Sequence[tuple[Delivery, AfterAttempt, str | None]],
               now_ms: int) -> None:
        """Store what attempts did: delivered, failed for good, or pending with a next time."""
        if not results:
            return
        with self.engine.begin() as conn:
            conn.execute(_RESULT, [{
                "key": d.key, "attempts": d.attempt, "status": after.status,
                "next": after.next_attempt_ms,
                "error": None if error is None else error[:ERROR_CHARS],
                "delivered": now_ms if after.status == "delivered" else None,
            } for d, after, error in results])

    def backlog(self) -> tuple[int, int]:
        """(unpublished outbox rows, pending deliveries): both counts use an index."""
        with self.engine.connect() as conn:
            unpublished, pending = conn.execute(_BACKLOG).one()
        return int(unpublished), int(pending)

    def delivery(self, key: str) -> Any | None:
        """One delivery row (operators and tests)."""
        with self.engine.connect() as conn:
            return conn.execute(_DELIVERY, {"key": key}).first()
