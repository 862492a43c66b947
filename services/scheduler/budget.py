"""Billing limits: the batches of billing projects that reached their limit.

The leader asks every ``budget_s`` (off the scheduling hot path: one small query, run in a
thread) and cancels what it gets with reason ``billing_limit``; ingest refuses new submissions
to those projects with the reference's 403 on its own. Cost is the projector's rollup
(``aggregated_billing_project_resources`` times ``resources.rate``), so enforcement trails the
heartbeats by at most a heartbeat interval plus the projector's lag.
"""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from services.common.settings import DatabaseSettings

_OVER_LIMIT = sa.text(
    "SELECT b.id FROM billing_projects p JOIN batches b ON b.billing_project = p.name "
    "WHERE p.limit_usd IS NOT NULL AND b.state != 'complete' AND b.deleted = 0 "
    "AND NOT EXISTS (SELECT 1 FROM batches_cancelled c WHERE c.batch_id = b.id) "
    "AND p.limit_usd <= (SELECT COALESCE(SUM(a.resource_usage * r.rate), 0) "
    "FROM aggregated_billing_project_resources a JOIN resources r ON r.resource = a.resource "
    "WHERE a.billing_project = p.name) ORDER BY b.id")


class Budgets:
    """Reads which batches are over their billing project's limit; an async context manager."""

    def __init__(self, db: DatabaseSettings) -> None:
        self._engine = sa.create_engine(db.url(), pool_size=1, max_overflow=0,
                                        pool_pre_ping=True)

    async def __aenter__(self) -> Budgets:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._engine.dispose()

    async def over_limit(self) -> list[int]:
        """Ids of unfinished, uncancelled batches whose billing project reached its limit."""
        return await asyncio.to_thread(self._over_limit)

    def _over_limit(self) -> list[int]:
        with self._engine.connect() as conn:
            return [int(b) for (b,) in conn.execute(_OVER_LIMIT)]
