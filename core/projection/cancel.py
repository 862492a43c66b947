"""Cancelling a job group (the batch is its root group 0): O(groups), never O(jobs).

The cancelled groups' cancellable resources leave the fair-share counters at once: ready and
running jobs and cores move to the ``n_cancelled_*`` columns of the user's tokenized row, and
the groups' cancellable rows are deleted. Job rows are not touched (that would be O(jobs)):
a job is cancelled when its group or an ancestor is in ``job_groups_cancelled``, and the
canceller drains such jobs later, turning them Cancelled one by one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from core.projection.counters import CANCELLABLE, USER_RESOURCES
from core.projection.ops import Delete, Increment, InsertIgnore, Op
from schemas.base import CancelReason


@dataclass(frozen=True)
class Cancellable:
    """One row of a group's cancellable resources (summed over tokens)."""

    job_group_id: int
    inst_coll: str
    n_ready: int
    ready_cores_mcpu: int
    n_running: int
    running_cores_mcpu: int
    n_creating: int


def plan_cancel(
    *,
    batch_id: int,
    user: str,
    groups: Sequence[int],
    cancellable: Sequence[Cancellable],
    reason: CancelReason,
    token: int,
    now_ms: int,
) -> list[Op]:
    """Operations that cancel ``groups`` (a group and its not-yet-cancelled descendants).

    Args:
        batch_id: the batch.
        user: the batch's owner, whose fair-share counters change.
        groups: the groups to cancel now; empty when all were cancelled already.
        cancellable: the cancellable resources of exactly those groups.
        reason: why.
        token: the writer's token.
        now_ms: when.

    Returns:
        The operations, or none when there is nothing left to cancel.

    """
    if not groups:
        return []
    ops: list[Op] = [InsertIgnore("job_groups_cancelled", [
        {"batch_id": batch_id, "job_group_id": g, "reason": reason, "time_cancelled_ms": now_ms}
        for g in groups])]
    if 0 in groups:
        ops.append(InsertIgnore("batches_cancelled", [
            {"batch_id": batch_id, "reason": reason, "time_cancelled_ms": now_ms}]))
    per_coll: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for c in cancellable:
        acc = per_coll[c.inst_coll]
        for i, v in enumerate((c.n_ready, c.ready_cores_mcpu, c.n_running,
                               c.running_cores_mcpu, c.n_creating)):
            acc[i] += v
    for inst_coll, (n_ready, ready_cores, n_running, running_cores, n_creating) in sorted(
            per_coll.items()):
        ops.append(Increment(USER_RESOURCES, {"user": user, "inst_coll": inst_coll,
                                              "token": token}, {
            "n_ready_jobs": -n_ready, "ready_cores_mcpu": -ready_cores,
            "n_running_jobs": -n_running, "running_cores_mcpu": -running_cores,
            "n_creating_jobs": -n_creating,
            "n_cancelled_ready_jobs": n_ready, "n_cancelled_running_jobs": n_running,
            "n_cancelled_creating_jobs": n_creating,
        }))
    ops += [Delete(CANCELLABLE, {"batch_id": batch_id, "job_group_id": g}) for g in groups]
    return ops
