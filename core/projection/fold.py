"""Events that need no projection state become row operations directly.

Each function maps one event (and the envelope's time) to operations. Every insert is
idempotent on its primary key, so a bunch submitted twice changes nothing the second time.
Events whose effect depends on current state (commit, cancellation) are planned in
:mod:`core.projection.commit` and :mod:`core.projection.cancel` from state the sink loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

from core.projection.commit import start_of
from core.projection.ops import Delete, InsertIgnore, Op, Row, Update, Upsert, Value
from schemas.batch import (
    BatchCreated,
    BatchDeleted,
    JobGroupsSubmitted,
    JobHead,
    JobHeadsSubmitted,
    UpdateOpened,
)
from schemas.control import (
    BillingLimitSet,
    BillingProjectClosed,
    BillingProjectCreated,
    BillingProjectDeleted,
    BillingProjectMemberAdded,
    BillingProjectMemberRemoved,
    BillingProjectReopened,
    ControlEvent,
    ResourceRateSet,
    ServiceFreezeSet,
    TokenIssued,
    TokenRevoked,
    UserCreated,
    UserDeleted,
)

NAME: Final = "name"  # the job attribute kept in the jobs row's own column (sql/013)


def _json(attributes: Mapping[str, str]) -> str | None:
    return json.dumps(dict(attributes), sort_keys=True) if attributes else None


def fold_control(event: ControlEvent, time_ms: int) -> list[Op]:
    """Operations for a control-plane event (users, tokens, billing projects, rates)."""
    match event:
        case UserCreated():
            return [Upsert("users", [{
                "name": event.user, "login_id": event.login_id,
                "is_developer": event.is_developer,
                "is_service_account": event.is_service_account,
                "deleted": False, "time_created_ms": time_ms, "time_deleted_ms": None,
            }], ("login_id", "is_developer", "is_service_account", "deleted",
                 "time_deleted_ms"))]
        case UserDeleted():
            return [Update("users", {"deleted": True, "time_deleted_ms": time_ms},
                           {"name": event.user})]
        case TokenIssued():
            return [InsertIgnore("auth_tokens", [{
                "token_id": event.token_id, "user": event.user,
                "token_hash": event.token_sha256, "time_created_ms": time_ms,
                "expires_at_ms": event.expires_at_ms,
            }])]
        case TokenRevoked():
            return [Update("auth_tokens", {"revoked": True, "time_revoked_ms": time_ms},
                           {"token_id": event.token_id, "user": event.user})]
        case BillingProjectCreated():
            return [Upsert("billing_projects", [{
                "name": event.billing_project, "status": "open", "limit_usd": None,
                "time_created_ms": time_ms, "time_updated_ms": time_ms,
            }], ("status", "time_updated_ms"))]
        case BillingProjectClosed() | BillingProjectReopened() | BillingProjectDeleted():
            status = {BillingProjectClosed: "closed", BillingProjectReopened: "open",
                      BillingProjectDeleted: "deleted"}[type(event)]
            return [Update("billing_projects", {"status": status, "time_updated_ms": time_ms},
                           {"name": event.billing_project})]
        case BillingProjectMemberAdded():
            return [InsertIgnore("billing_project_users", [{
                "billing_project": event.billing_project, "user": event.user,
                "time_added_ms": time_ms}])]
        case BillingProjectMemberRemoved():
            return [Delete("billing_project_users",
                           {"billing_project": event.billing_project, "user": event.user})]
        case BillingLimitSet():
            limit = None if event.limit is None else str(event.limit)
            return [Update("billing_projects", {"limit_usd": limit, "time_updated_ms": time_ms},
                           {"name": event.billing_project})]
        case ResourceRateSet():
            product, _, version = event.resource.rpartition("/")
            return [Upsert("resources", [{
                "resource": event.resource, "product": product or event.resource,
                "version": version if product else "1", "rate": str(event.rate),
                "time_created_ms": time_ms}], ("rate",))]
        case ServiceFreezeSet():
            return [Upsert("feature_flags", [{"name": "frozen", "enabled": event.frozen,
                                              "time_updated_ms": time_ms}],
                           ("enabled", "time_updated_ms"))]
    raise TypeError(f"not a control event: {type(event).__name__}")


def fold_batch_created(event: BatchCreated, time_ms: int) -> list[Op]:
    """The batch row, its attributes, its root job group (0) and the group's counters.

    A batch created ``empty`` is closed and complete at once, its root group too.
    """
    b = event.batch_id
    done: dict[str, int | str | None] = {}
    group_done: dict[str, int | str | None] = {}
    if event.empty:
        done = {"state": "complete", "time_closed_ms": time_ms, "time_completed_ms": time_ms}
        group_done = {"state": "complete", "time_completed_ms": time_ms}
    ops: list[Op] = [
        InsertIgnore("batches", [{
            "id": b, "user": event.user, "billing_project": event.billing_project,
            "token": event.token, "attributes": _json(event.attributes),
            "callback": event.callback, "cancel_after_n_failures": event.cancel_after_n_failures,
            "time_created_ms": time_ms, **done}]),
        InsertIgnore("job_groups", [{
            "batch_id": b, "job_group_id": 0, "update_id": None, "parent_id": None, "depth": 0,
            "attributes": _json(event.attributes), "callback": event.callback,
            "cancel_after_n_failures": event.cancel_after_n_failures, "committed": True,
            "time_created_ms": time_ms, **group_done}]),
        InsertIgnore("job_group_self_and_ancestors", [
            {"batch_id": b, "job_group_id": 0, "ancestor_id": 0, "level": 0}]),
        InsertIgnore("job_group_job_counts", [{"batch_id": b, "job_group_id": 0}]),
    ]
    if event.attributes:
        ops.append(InsertIgnore("batch_attributes", [
            {"batch_id": b, "attr_key": k, "attr_value": v} for k, v in event.attributes.items()
        ]))
    return ops


def fold_update_opened(event: UpdateOpened, time_ms: int) -> list[Op]:
    """The update row (uncommitted)."""
    return [InsertIgnore("batch_updates", [{
        "batch_id": event.batch_id, "update_id": event.update_id, "token": event.token,
        "start_job_id": event.start_job_id, "n_jobs": event.n_jobs,
        "start_job_group_id": event.start_job_group_id, "n_job_groups": event.n_job_groups,
        "time_created_ms": time_ms}])]


def fold_job_groups(event: JobGroupsSubmitted, time_ms: int,
                    parent_ancestry: Mapping[int, Sequence[tuple[int, int]]]) -> list[Op]:
    """Group rows (uncommitted), closure rows, attributes and zeroed counters.

    Args:
        event: the bunch.
        time_ms: when it was appended.
        parent_ancestry: for each parent *outside* the bunch, its (ancestor, level) pairs
            including itself at level 0. Parents inside the bunch come before their children.

    """
    b = event.batch_id
    ancestry: dict[int, list[tuple[int, int]]] = {k: list(v) for k, v in parent_ancestry.items()}
    groups: list[Row] = []
    closure: list[Row] = []
    attrs: list[Row] = []
    counts: list[Row] = []
    for g in event.job_groups:
        chain = [(g.job_group_id, 0)] + [(a, lvl + 1) for a, lvl in ancestry[g.parent_id]]
        ancestry[g.job_group_id] = chain
        groups.append({
            "batch_id": b, "job_group_id": g.job_group_id, "update_id": event.update_id,
            "parent_id": g.parent_id, "depth": len(chain) - 1, "attributes": _json(g.attributes),
            "callback": g.callback, "cancel_after_n_failures": g.cancel_after_n_failures,
            "time_created_ms": time_ms})
        closure += [{"batch_id": b, "job_group_id": g.job_group_id, "ancestor_id": a,
                     "level": lvl} for a, lvl in chain]
        attrs += [{"batch_id": b, "job_group_id": g.job_group_id, "attr_key": k,
                   "attr_value": v} for k, v in g.attributes.items()]
        counts.append({"batch_id": b, "job_group_id": g.job_group_id})
    ops: list[Op] = [InsertIgnore("job_groups", groups),
                     InsertIgnore("job_group_self_and_ancestors", closure),
                     InsertIgnore("job_group_job_counts", counts)]
    if attrs:
        ops.append(InsertIgnore("job_group_attributes", attrs))
    return ops


def fold_jobs(event: JobHeadsSubmitted, jobs: Sequence[JobHead] | None = None, *,
              extra: Row | None = None) -> list[Op]:
    """Job rows, parent edges and attributes of ``jobs`` (default: the whole bunch).

    A job's name (its attribute ``name``) is a column of its row; other attributes are rows.

    Rows start as :func:`core.projection.commit.start_of` says and stay invisible until the
    update is committed. ``extra``: more columns, the same in every row, after the others
    (the rebuild's fold writes each row once, with its execution columns).
    """
    b, u = event.batch_id, event.update_id
    rows: list[Row] = []
    parents: list[Row] = []
    attrs: list[Row] = []
    # Every row starts as a copy of one with the bunch's own values and the start of a job
    # without parents, then takes the job's: a copy and a store per column cost about half of
    # building each row from a literal (more again when ``extra`` was added after: a resize).
    ready, no_pending = start_of(())
    template: dict[str, Value] = {
        "batch_id": b, "job_id": 0, "update_id": u, "job_group_id": 0, "state": ready,
        "n_pending_parents": no_pending, "always_run": False, "n_max_attempts": 0,
        "cores_mcpu": 0, "memory_bytes": None, "storage_gib": None, "machine_type": None,
        "preemptible": None, "regions": None, "inst_coll": None, "name": None}
    if extra:
        template.update(extra)
    copy = template.copy
    for j in event.jobs if jobs is None else jobs:
        r = j.resources
        attributes = j.attributes
        row = copy()
        row["job_id"] = j.job_id
        row["job_group_id"] = j.job_group_id
        if j.parent_ids:
            row["state"], row["n_pending_parents"] = start_of(j.parent_ids)
        row["always_run"] = j.always_run
        row["n_max_attempts"] = j.n_max_attempts
        row["cores_mcpu"] = r.cores_mcpu
        row["memory_bytes"] = r.memory_bytes
        row["storage_gib"] = r.storage_gib
        row["machine_type"] = r.machine_type
        row["preemptible"] = r.preemptible
        if r.regions is not None:
            row["regions"] = json.dumps(r.regions)
        row["inst_coll"] = j.inst_coll
        row["name"] = attributes.get(NAME)
        rows.append(row)
        # Most jobs have no parents and no attribute but their name: no rows, no loops.
        if j.parent_ids:
            parents += [{"batch_id": b, "job_id": j.job_id, "parent_id": p}
                        for p in j.parent_ids]
        if len(attributes) > (NAME in attributes):
            attrs += [{"batch_id": b, "job_id": j.job_id, "attr_key": k, "attr_value": v}
                      for k, v in attributes.items() if k != NAME]
    ops: list[Op] = [InsertIgnore("jobs", rows)] if rows else []
    if parents:
        ops.append(InsertIgnore("job_parents", parents))
    if attrs:
        ops.append(InsertIgnore("job_attributes", attrs))
    return ops


def fold_batch_deleted(event: BatchDeleted, time_ms: int) -> list[Op]:
    """The batch becomes invisible (its cancellation is a separate fact)."""
    return [Update("batches", {"deleted": True, "time_deleted_ms": time_ms},
                   {"id": event.batch_id})]
