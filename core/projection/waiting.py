"""``scheduler.waiting_reasons`` to row operations (pure): why ready jobs wait.

Rows live in ``user_waiting_reasons`` (per user and inst_coll) and ``job_waiting_reasons`` (per
job); ``waiting_reasons_epoch`` holds the newest epoch applied. Like SJs of a deposed scheduler,
an event of an older epoch changes nothing. The first event of a newer epoch replaces what
earlier epochs said: every existing row is deleted before its entries are applied (its leader
starts from nothing and sends every entry it knows).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.projection.ops import Delete, Op, Upsert
from schemas.control import WaitingReasonsChanged

EPOCH_SCOPE = "scheduler"
"""The key of the one row of ``waiting_reasons_epoch``."""

_COLUMNS = ("reason", "message", "since_ms", "epoch", "time_updated_ms")


def needs_reset(event: WaitingReasonsChanged, stored_epoch: int | None) -> bool:
    """Whether the event starts a newer epoch, so every existing row must go first.

    Args:
        event: The event.
        stored_epoch: The newest epoch applied so far, None if none.

    Returns:
        True for the first event of a newer epoch.

    """
    return stored_epoch is None or event.epoch > stored_epoch


def fold_waiting_reasons(event: WaitingReasonsChanged, time_ms: int, *,
                         stored_epoch: int | None,
                         existing_users: Sequence[tuple[str, str]] = (),
                         existing_jobs: Sequence[tuple[int, int]] = ()) -> list[Op]:
    """Operations for one ``scheduler.waiting_reasons`` event.

    Args:
        event: The event.
        time_ms: The envelope's time (``since_ms`` of entries without one; the update time).
        stored_epoch: The newest epoch applied so far (``waiting_reasons_epoch``), or None.
        existing_users: On a reset (:func:`needs_reset`), the keys of every
            ``user_waiting_reasons`` row.
        existing_jobs: On a reset, the keys of every ``job_waiting_reasons`` row.

    Returns:
        Nothing for a stale event; else the deletes of a reset, then one upsert or delete per
        entry, then the epoch row.

    """
    if stored_epoch is not None and event.epoch < stored_epoch:
        return []  # a deposed scheduler's view: ignored, like its SJs
    ops: list[Op] = []
    if needs_reset(event, stored_epoch):
        ops += [Delete("user_waiting_reasons", {"user": u, "inst_coll": ic})
                for u, ic in existing_users]
        ops += [Delete("job_waiting_reasons", {"batch_id": b, "job_id": j})
                for b, j in existing_jobs]
    for e in event.entries:
        job = e.batch_id is not None and e.job_id is not None
        table = "job_waiting_reasons" if job else "user_waiting_reasons"
        key: dict[str, str | int | None] = (
            {"batch_id": e.batch_id, "job_id": e.job_id} if job
            else {"user": e.user, "inst_coll": e.inst_coll})
        if e.reason is None:
            ops.append(Delete(table, key))
            continue
        row = {**key, "reason": e.reason, "message": e.message,
               "since_ms": time_ms if e.since_ms is None else e.since_ms,
               "epoch": event.epoch, "time_updated_ms": time_ms}
        if job:
            row |= {"user": e.user, "inst_coll": e.inst_coll}
        ops.append(Upsert(table, [row], (*_COLUMNS, *(("user", "inst_coll") if job else ()))))
    ops.append(Upsert("waiting_reasons_epoch", [{
        "scope": EPOCH_SCOPE, "epoch": event.epoch, "time_updated_ms": time_ms}],
        ("epoch", "time_updated_ms")))
    return ops
