"""Billing rollups: one billed interval of an attempt as counter increments.

Usage lands in every rollup at once, so each total is exactly the sum of its parts: per job
group and each of its ancestors up to the batch (group 0), per batch, per billing project, per
billing project, user and UTC day, and per user (tokenized: the projector partition's token).
A job's own usage is not a rollup row: it is a column of its ``jobs`` row
(``core.billing.usage_text``), which its batch's one writer keeps.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.billing import DAY_MS, by_day, day_name, usage
from core.projection.ops import Increment, Increments
from schemas.base import AttemptResource

JOB_GROUP: str = "aggregated_job_group_resources"
BATCH: str = "aggregated_batch_resources"
BILLING_PROJECT: str = "aggregated_billing_project_resources"
BILLING_PROJECT_USER_DATE: str = "aggregated_billing_project_user_resources_by_date"
USER: str = "aggregated_user_resources"
TABLES: tuple[str, ...] = (JOB_GROUP, BATCH, BILLING_PROJECT, BILLING_PROJECT_USER_DATE,
                           USER)


@dataclass(frozen=True, slots=True)
class Billed:
    """Whose usage an interval is: the job, its group ancestry, the batch's project and user."""

    batch_id: int
    job_id: int
    groups: Sequence[int]
    """The job's group and every ancestor up to 0 (the batch)."""
    billing_project: str
    user: str


def accrue(who: Billed, resources: Iterable[AttemptResource], from_ms: int, to_ms: int,
           token: int) -> list[Increment]:
    """The increments that bill ``resources`` over ``[from_ms, to_ms)`` to ``who``."""
    resources = list(resources)
    total = usage(resources, from_ms, to_ms)
    if not total:
        return []
    ops: list[Increment] = []
    b = who.batch_id
    for resource, amount in sorted(total.items()):
        delta = {"resource_usage": amount}
        ops += [Increment(JOB_GROUP, {"batch_id": b, "job_group_id": g, "resource": resource,
                                      "token": token}, delta) for g in who.groups]
        ops.append(Increment(BATCH, {"batch_id": b, "resource": resource, "token": token},
                             delta))
        ops.append(Increment(BILLING_PROJECT, {"billing_project": who.billing_project,
                                               "resource": resource, "token": token}, delta))
        ops.append(Increment(USER, {"user": who.user, "resource": resource, "token": token},
                             delta))
    for day, start, end in by_day(from_ms, to_ms):
        for resource, amount in sorted(usage(resources, start, end).items()):
            ops.append(Increment(BILLING_PROJECT_USER_DATE, {
                "billing_project": who.billing_project, "user": who.user,
                "usage_date": day.isoformat(), "resource": resource, "token": token},
                {"resource_usage": amount}))
    return ops


def accrue_into(acc: Increments, who: Billed, quantities: Mapping[str, int], from_ms: int,
                to_ms: int, token: int) -> None:
    """Add to ``acc`` what :func:`accrue` returns, without an :class:`Increment` per row.

    ``quantities`` are an attempt's resources (resource -> quantity). The projector bills
    every attempt that ends into some thirty rollup rows (six resources, five rollups); built as
    ops that was a seventh of its time in a no-op run. Drained, ``acc`` holds exactly
    ``merge_increments`` of the ops :func:`accrue` returns.
    """
    ms = to_ms - from_ms
    if ms <= 0 or not quantities:
        return
    b, project, user = who.batch_id, who.billing_project, who.user
    bump = acc.bump
    usage_key = "resource_usage"
    for resource, quantity in quantities.items():
        amount = quantity * ms
        for g in who.groups:
            bump(JOB_GROUP, (("batch_id", b), ("job_group_id", g), ("resource", resource),
                             ("token", token)), usage_key, amount)
        bump(BATCH, (("batch_id", b), ("resource", resource), ("token", token)), usage_key,
             amount)
        bump(BILLING_PROJECT, (("billing_project", project), ("resource", resource),
                               ("token", token)), usage_key, amount)
        bump(USER, (("user", user), ("resource", resource), ("token", token)), usage_key,
             amount)
    first_day = from_ms // DAY_MS
    if (to_ms - 1) // DAY_MS == first_day:  # within one UTC day: the totals above
        days = [(day_name(first_day), ms)]
    else:
        days = [(day.isoformat(), end - start) for day, start, end in by_day(from_ms, to_ms)]
    for day_iso, day_ms in days:
        for resource, quantity in quantities.items():
            bump(BILLING_PROJECT_USER_DATE, (
                ("billing_project", project), ("user", user), ("usage_date", day_iso),
                ("resource", resource), ("token", token)), usage_key, quantity * day_ms)

