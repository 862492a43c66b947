"""Billing projects over the API: reads for members, changes for developers (control events).

Members see their projects; developers see and manage all. An unknown project, or one the user
does not belong to, is a 403 with the reference's text.
"""

from __future__ import annotations

import asyncio
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from core.errors import BadRequest, Forbidden
from schemas.control import (
    BillingLimitSet,
    BillingProjectClosed,
    BillingProjectCreated,
    BillingProjectDeleted,
    BillingProjectMemberAdded,
    BillingProjectMemberRemoved,
    BillingProjectReopened,
)
from schemas.events import AnyEvent
from services.common.log import Publisher
from services.ingest import metrics as ingest_metrics
from services.ingest.store import Store, User

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,99}$")
_PROJECTS = (
    "SELECT p.name, p.status, p.limit_usd, "
    "(SELECT COALESCE(SUM(a.resource_usage * r.rate), 0) FROM "
    " aggregated_billing_project_resources a JOIN resources r ON r.resource = a.resource "
    " WHERE a.billing_project = p.name) AS accrued FROM billing_projects p "
    "WHERE p.status != 'deleted' ")
_MEMBERS = "SELECT billing_project, user FROM billing_project_users ORDER BY user"
_SPENT = (
    "SELECT a.billing_project, a.user, SUM(a.resource_usage * r.rate) FROM "
    "aggregated_billing_project_user_resources_by_date a JOIN resources r "
    "ON r.resource = a.resource GROUP BY a.billing_project, a.user "
    "ORDER BY a.billing_project, a.user")


def unknown(name: str) -> Forbidden:
    return Forbidden(f"Unknown Hail Batch billing project {name}.")


class Billing:
    """Billing-project reads and developer commands."""

    def __init__(self, store: Store, publisher: Publisher, *, wait_s: float = 15.0) -> None:
        self.store = store
        self.publisher = publisher
        self.wait_s = wait_s

    # --- reads ----------------------------------------------------------------------------
    def projects(self, user: User, status: str | None = None,
                 name: str | None = None) -> list[dict[str, Any]]:
        if status not in (None, "open", "closed"):
            raise BadRequest(f"status must be open or closed, not {status!r}")
        sql, params = _PROJECTS, {}
        if status is not None:
            sql += "AND p.status = :status "
            params["status"] = status
        if name is not None:
            sql += "AND p.name = :name "
            params["name"] = name
        members: dict[str, list[str]] = {}
        for project, member in self.store.rows(_MEMBERS):
            members.setdefault(str(project), []).append(str(member))
        out = []
        for row in self.store.rows(sql + "ORDER BY p.name", **params):
            users = members.get(str(row.name), [])
            if not user.is_developer and user.name not in users:
                continue
            out.append({"billing_project": row.name, "status": row.status, "users": users,
                        "limit": None if row.limit_usd is None else float(row.limit_usd),
                        "accrued_cost": float(row.accrued or 0)})
        return out

    def project(self, user: User, name: str) -> dict[str, Any]:
        found = self.projects(user, name=name)
        if not found:
            raise unknown(name)
        return found[0]

    def spent(self, user: User) -> list[dict[str, Any]]:
        return [{"billing_project": p, "user": u, "total_spent": float(c or 0)}
                for p, u, c in self.store.rows(_SPENT)
                if user.is_developer or u == user.name]

    # --- developer commands -----------------------------------------------------------------
    async def _append(self, events: list[AnyEvent]) -> None:
        positions = await self.publisher.publish_many(events)
        ingest_metrics.appended(len(positions))
        await self.store.wait_applied(positions, timeout_s=self.wait_s)

    async def _existing(self, user: User, name: str) -> dict[str, Any]:
        if not user.is_developer:
            raise Forbidden("only developers may manage billing projects")
        return await asyncio.to_thread(self.project, user, name)

    async def create(self, user: User, name: str) -> str:
        if not user.is_developer:
            raise Forbidden("only developers may manage billing projects")
        if not _NAME.match(name):
            raise BadRequest(f"invalid billing project name {name!r}: use letters, digits, "
                             "'-' and '_' (at most 100)")
        if await asyncio.to_thread(self.projects, user, None, name):
            raise Forbidden(f"billing project {name} already exists")
        await self._append([BillingProjectCreated(billing_project=name)])
        return name

    async def close(self, user: User, name: str) -> str:
        project = await self._existing(user, name)
        if project["status"] == "closed":
            raise Forbidden(f"Billing project {name} is already closed.")
        running = await asyncio.to_thread(
            self.store.one, "SELECT COUNT(*) FROM batches WHERE billing_project = :p AND "
            "state = 'running' AND NOT deleted", p=name)
        if running and running[0]:
            raise Forbidden(f"Billing project {name} has open or running batches.")
        await self._append([BillingProjectClosed(billing_project=name)])
        return name

    async def reopen(self, user: User, name: str) -> str:
        project = await self._existing(user, name)
        if project["status"] == "open":
            raise Forbidden(f"Billing project {name} is already open.")
        await self._append([BillingProjectReopened(billing_project=name)])
        return name

    async def delete(self, user: User, name: str) -> str:
        project = await self._existing(user, name)
        if project["status"] != "closed":
            raise Forbidden(f"Billing project {name} must be closed before deleting.")
        await self._append([BillingProjectDeleted(billing_project=name)])
        return name

    async def add_user(self, user: User, name: str, member: str) -> dict[str, str]:
        project = await self._existing(user, name)
        if member in project["users"]:
            raise Forbidden(f"User {member} is already member of billing project {name}.")
        await self._append([BillingProjectMemberAdded(billing_project=name, user=member)])
        return {"billing_project": name, "user": member}

    async def remove_user(self, user: User, name: str, member: str) -> dict[str, str]:
        project = await self._existing(user, name)
        if member not in project["users"]:
            raise Forbidden(f"User {member} is not in billing project {name}.")
        await self._append([BillingProjectMemberRemoved(billing_project=name, user=member)])
        return {"billing_project": name, "user": member}

    async def edit_limit(self, user: User, name: str, body: Any) -> dict[str, Any]:
        await self._existing(user, name)
        if not isinstance(body, dict) or "limit" not in body:
            raise BadRequest("body must be an object with a 'limit'")
        raw = body["limit"]
        try:
            limit = None if raw is None else Decimal(str(raw))
        except InvalidOperation:
            raise BadRequest(f"Invalid billing_limit {raw!r}.") from None
        if isinstance(raw, bool) or (limit is not None and (not limit.is_finite() or limit < 0)):
            raise BadRequest(f"Invalid billing_limit {raw!r}.")
        await self._append([BillingLimitSet(billing_project=name, limit=limit)])
        return {"billing_project": name, "limit": None if limit is None else float(limit)}
