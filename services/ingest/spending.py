"""Spending over time: cost per billing project, user and UTC day (a read repository).

From the tokenized ``aggregated_billing_project_user_resources_by_date`` rollup (summed over its
tokens). Visibility follows ``GET /billing``: a user sees their own spending, a developer sees
everyone's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from services.ingest.store import Store, User

_BY_DAY = (
    "SELECT a.usage_date, a.billing_project, a.user, SUM(a.resource_usage * r.rate) AS cost "
    "FROM aggregated_billing_project_user_resources_by_date a JOIN resources r "
    "ON r.resource = a.resource WHERE a.usage_date >= :since {mine}"
    "GROUP BY a.usage_date, a.billing_project, a.user "
    "ORDER BY a.usage_date DESC, a.billing_project, a.user")


class DailyCost(msgspec.Struct, frozen=True, kw_only=True):
    day: str  # YYYY-MM-DD (UTC)
    billing_project: str
    user: str
    cost: float


class Spending:
    """Cost by day, for one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def by_day(self, user: User, *, days: int = 30, today: dt.date | None = None
               ) -> list[DailyCost]:
        """Cost per (day, billing project, user) over the last ``days`` UTC days, newest
        first; only ``user``'s own unless a developer."""
        since = (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=days - 1)
        params: dict[str, Any] = {"since": since}
        mine = ""
        if not user.is_developer:
            mine = "AND a.user = :user "
            params["user"] = user.name
        return [DailyCost(day=str(r.usage_date), billing_project=str(r.billing_project),
                          user=str(r.user), cost=float(r.cost or 0))
                for r in self.store.rows(_BY_DAY.format(mine=mine), **params)]
