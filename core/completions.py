"""Completions of batches and job groups, and the callbacks they owe (pure).

A batch (job group 0) or a job group *completes* when its last job ends, or when a commit leaves
it with no unfinished job. A batch reopened by an update completes again later, with more jobs;
jobs are never removed, so ``(batch_id, job_group_id, n_jobs)`` names one completion for good.
That triple keys the projector's outbox row, the completion's event id on the completions topic
and the ``Idempotency-Key`` of its HTTP callback, so every retry of either is recognisable.

Callbacks are retried with capped exponential backoff and "equal jitter": attempt ``k`` waits
between half and all of ``min(cap, base * 2**(k-1))``, so retries spread out but never shrink to
nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from core.projection.ops import InsertIgnore, Op, Row
from core.status import format_time_ms, humanize_ms
from schemas.base import BatchOutcome
from schemas.batch import BatchCompleted, JobGroupCompleted

OUTBOX = "completions_outbox"
_EVENT_NAMESPACE = uuid.UUID("5f0c7d8e-2b7a-4c55-9a51-0c6d3a1e4b21")

DeliveryStatus = Literal["pending", "delivered", "failed"]


@dataclass(frozen=True)
class Completion:
    """One completion of a batch (``job_group_id`` 0) or job group, with its counts then."""

    batch_id: int
    job_group_id: int
    n_jobs: int
    outcome: BatchOutcome
    n_succeeded: int
    n_failed: int
    n_cancelled: int
    time_completed_ms: int

    @property
    def key(self) -> str:
        """The completion's idempotency key (see :func:`idempotency_key`)."""
        return idempotency_key(self.batch_id, self.job_group_id, self.n_jobs)


def outcome(*, n_failed: int, cancelled: bool) -> BatchOutcome:
    """How a complete batch or group ended, as the API's ``state`` reports it.

    Args:
        n_failed: its Failed and Error jobs (recursive over child groups).
        cancelled: whether it (or, for a group, an ancestor) was cancelled.

    Returns:
        ``failure`` if any job failed, else ``cancelled`` if it was cancelled, else ``success``.

    """
    if n_failed > 0:
        return "failure"
    return "cancelled" if cancelled else "success"


def completion_ops(batch_id: int, counts: Iterable[Sequence[int]],
                   cancelled_groups: frozenset[int], now_ms: int) -> list[Op]:
    """The outbox rows of groups that just completed, written with the completion.

    Args:
        batch_id: the batch.
        counts: ``(job_group_id, n_jobs, n_succeeded, n_failed, n_cancelled)`` of each group
            that completed, as of the completion (0 is the batch).
        cancelled_groups: the batch's cancelled groups (0 when the batch is cancelled).
        now_ms: the time of the event that completed them.

    Returns:
        One idempotent insert (a completion written twice is one row), or nothing.

    """
    rows: list[Row] = []
    for g, n_jobs, n_succeeded, n_failed, n_cancelled in sorted(
            tuple(int(v) for v in row) for row in counts):
        rows.append({
            "batch_id": batch_id, "job_group_id": g, "n_jobs": n_jobs,
            "outcome": outcome(n_failed=n_failed, cancelled=g in cancelled_groups),
            "n_succeeded": n_succeeded, "n_failed": n_failed, "n_cancelled": n_cancelled,
            "time_completed_ms": now_ms})
    return [InsertIgnore(OUTBOX, rows)] if rows else []


def idempotency_key(batch_id: int, job_group_id: int, n_jobs: int) -> str:
    """The ``Idempotency-Key`` of a completion's callback: stable across retries and restarts.

    Args:
        batch_id: the batch.
        job_group_id: the group, 0 for the batch itself.
        n_jobs: the jobs it had when it completed (tells apart completions of a reopened batch).

    Returns:
        ``completion-<batch>-<group>-<n_jobs>``.

    """
    return f"completion-{batch_id}-{job_group_id}-{n_jobs}"


def event_of(c: Completion) -> BatchCompleted | JobGroupCompleted:
    """The completions-topic event of a completion."""
    if c.job_group_id == 0:
        return BatchCompleted(batch_id=c.batch_id, outcome=c.outcome, n_jobs=c.n_jobs,
                              n_succeeded=c.n_succeeded, n_failed=c.n_failed,
                              n_cancelled=c.n_cancelled, time_completed_ms=c.time_completed_ms)
    return JobGroupCompleted(batch_id=c.batch_id, job_group_id=c.job_group_id, outcome=c.outcome,
                             n_jobs=c.n_jobs, n_succeeded=c.n_succeeded, n_failed=c.n_failed,
                             n_cancelled=c.n_cancelled, time_completed_ms=c.time_completed_ms)


def completion_of(event: BatchCompleted | JobGroupCompleted) -> Completion:
    """The completion an event announces (the inverse of :func:`event_of`)."""
    group = event.job_group_id if isinstance(event, JobGroupCompleted) else 0
    return Completion(event.batch_id, group, event.n_jobs, event.outcome, event.n_succeeded,
                      event.n_failed, event.n_cancelled, event.time_completed_ms)


def event_id(c: Completion) -> str:
    """A deterministic event id: a completion published twice carries the same id twice."""
    return uuid.uuid5(_EVENT_NAMESPACE, c.key).hex


def backoff_ms(attempt: int, *, base_ms: int, cap_ms: int, jitter: float) -> int:
    """How long to wait after failed attempt number ``attempt`` (1 for the first).

    Args:
        attempt: how many attempts have failed so far (at least 1).
        base_ms: the ceiling after the first failure.
        cap_ms: the largest ceiling.
        jitter: a uniform draw from [0, 1): where in the upper half of the ceiling to land.

    Returns:
        A delay in ``[ceiling / 2, ceiling]`` with ``ceiling = min(cap, base * 2**(attempt-1))``.

    """
    if attempt < 1:
        raise ValueError(f"attempt must be at least 1, got {attempt}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    # Shift only as far as needed to pass the cap: attempt counts can be large.
    ceiling = cap_ms if attempt - 1 >= cap_ms.bit_length() else min(
        cap_ms, base_ms << (attempt - 1))
    half = ceiling // 2
    return half + int((ceiling - half) * jitter)


@dataclass(frozen=True)
class AfterAttempt:
    """What a delivery becomes after an attempt."""

    status: DeliveryStatus
    next_attempt_ms: int | None


def after_attempt(*, ok: bool, attempts: int, max_attempts: int, now_ms: int, base_ms: int,
                  cap_ms: int, jitter: float) -> AfterAttempt:
    """The delivery's state after its ``attempts``-th attempt succeeded (``ok``) or failed.

    Args:
        ok: whether the receiver answered 2xx.
        attempts: attempts made so far, this one included.
        max_attempts: attempts allowed in all.
        now_ms: the time the attempt ended.
        base_ms: see :func:`backoff_ms`.
        cap_ms: see :func:`backoff_ms`.
        jitter: see :func:`backoff_ms`.

    Returns:
        ``delivered``; ``failed`` when attempts are used up; else ``pending`` until the backoff.

    """
    if ok:
        return AfterAttempt("delivered", None)
    if attempts >= max_attempts:
        return AfterAttempt("failed", None)
    return AfterAttempt("pending", now_ms + backoff_ms(attempts, base_ms=base_ms, cap_ms=cap_ms,
                                                       jitter=jitter))


def sender_wait_s(next_due_ms: int | None, now_ms: int, *, idle_s: float) -> float:
    """How long an idle callback sender may sleep before it looks for due deliveries again.

    Until the earliest pending delivery is due (a retry's backoff, or a claim that expires
    because its attempt never reported), and never longer than ``idle_s``: a delivery owed
    afresh wakes the sender, and ``idle_s`` bounds what nothing wakes it for.

    Args:
        next_due_ms: when the earliest pending delivery is due, None if there is none.
        now_ms: the time now, in the same clock.
        idle_s: the longest sleep, in seconds (positive).

    Returns:
        Seconds in ``[0, idle_s]``; 0 when one is due already.

    """
    if idle_s <= 0:
        raise ValueError(f"idle_s must be positive, not {idle_s}")
    if next_due_ms is None:
        return idle_s
    return min(max(next_due_ms - now_ms, 0) / 1000, idle_s)


def as_of_completion(status: Mapping[str, Any], c: Completion) -> dict[str, Any]:
    """A batch or group status document, with what the completion decided written over it.

    The callback is built from the current projection, which may have moved on (an update can
    reopen a batch before its callback goes out). The fields a completion decides are set from
    the completion, so every delivery of one completion says the same thing about it.

    Args:
        status: the batch status (GET /batches/{id}) or job group status document.
        c: the completion.

    Returns:
        A copy of ``status`` with ``complete``, ``state`` (the outcome), counts, completion time
        and duration taken from ``c``.

    """
    out = dict(status)
    out |= {"complete": True, "state": c.outcome, "n_jobs": c.n_jobs,
            "n_completed": c.n_succeeded + c.n_failed + c.n_cancelled,
            "n_succeeded": c.n_succeeded, "n_failed": c.n_failed, "n_cancelled": c.n_cancelled,
            "time_completed": format_time_ms(c.time_completed_ms)}
    created = parse_time(status.get("time_created"))
    duration = None if created is None else max(0, c.time_completed_ms - created)
    if c.job_group_id == 0:
        out |= {"duration_ms": duration, "duration": humanize_ms(duration)}
    else:
        out["duration"] = duration
    return out


def parse_time(text: object) -> int | None:
    """Milliseconds since the epoch of a time the API formatted (``...T00:00:00.123Z``).

    Args:
        text: what :func:`core.status.format_time_ms` produced, or anything else.

    Returns:
        The milliseconds, or None when ``text`` is not such a time.

    """
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(parsed.timestamp()) * 1000 + parsed.microsecond // 1000
