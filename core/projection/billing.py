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
from dataclasses import dataclass, field

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

    ``quantities`` are an attempt's resources (resource -> quantity). Drained, ``acc`` holds
    exactly ``merge_increments`` of the ops :func:`accrue` returns.
    """
    one = Accruals()
    one.add(who, quantities, from_ms, to_ms, token)
    one.drain_into(acc)


# (batch, groups, billing project, user, quantities, token)
_Whose = tuple[int, tuple[int, ...], str, str, tuple[tuple[str, int], ...], int]


@dataclass
class Accruals:
    """Billed intervals summed by whose usage they are, then made rollup increments at once.

    Usage is quantity times milliseconds, so the intervals of one batch, group ancestry,
    billing project, user, set of quantities and token add up as milliseconds (in all and per
    UTC day) and become their rollup rows once, when drained. The projector bills every
    attempt that ends into some thirty rollup rows (six resources, five rollups), and the
    attempts of a batch mostly share all of these: summing first spares each attempt its
    thirty row updates (a tenth of the projector's time with the GIL in a no-op run, py-spy).
    Drained, ``acc`` holds exactly what :func:`accrue_into` of each interval would add
    (tests/core/test_billing.py).
    """

    _ms: dict[_Whose, tuple[list[int], dict[str, int]]] = field(default_factory=dict)

    def add(self, who: Billed, quantities: Mapping[str, int], from_ms: int, to_ms: int,
            token: int) -> None:
        """Bill ``who`` for ``quantities`` from ``from_ms`` to ``to_ms`` (none if empty)."""
        ms = to_ms - from_ms
        if ms <= 0 or not quantities:
            return
        key = (who.batch_id, tuple(who.groups), who.billing_project, who.user,
               tuple(quantities.items()), token)
        sums = self._ms.get(key)
        if sums is None:
            sums = self._ms[key] = ([0], {})
        sums[0][0] += ms
        days = sums[1]
        first_day = from_ms // DAY_MS
        if (to_ms - 1) // DAY_MS == first_day:  # within one UTC day: the whole interval
            name = day_name(first_day)
            days[name] = days.get(name, 0) + ms
        else:
            for day, start, end in by_day(from_ms, to_ms):
                name = day.isoformat()
                days[name] = days.get(name, 0) + end - start

    def drain_into(self, acc: Increments) -> None:
        """Add the rollup increments of everything billed to ``acc``; then empty."""
        bump = acc.bump
        usage_key = "resource_usage"
        for (b, groups, project, user, quantities, token), (total, days) in self._ms.items():
            ms = total[0]
            for resource, quantity in quantities:
                amount = quantity * ms
                for g in groups:
                    bump(JOB_GROUP, (("batch_id", b), ("job_group_id", g),
                                     ("resource", resource), ("token", token)),
                         usage_key, amount)
                bump(BATCH, (("batch_id", b), ("resource", resource), ("token", token)),
                     usage_key, amount)
                bump(BILLING_PROJECT, (("billing_project", project), ("resource", resource),
                                       ("token", token)), usage_key, amount)
                bump(USER, (("user", user), ("resource", resource), ("token", token)),
                     usage_key, amount)
            for day_iso, day_ms in days.items():
                for resource, quantity in quantities:
                    bump(BILLING_PROJECT_USER_DATE, (
                        ("billing_project", project), ("user", user), ("usage_date", day_iso),
                        ("resource", resource), ("token", token)), usage_key,
                        quantity * day_ms)
        self._ms.clear()

