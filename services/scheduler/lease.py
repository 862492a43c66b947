"""Leadership among scheduler replicas: a named database lock held on one connection.

``GET_LOCK`` (MySQL 8 and MariaDB alike) belongs to a connection: the server releases it the
moment that connection ends, so a replica that crashes or is killed frees the lease at once and
the hot standby, polling for it, takes over within one poll interval. The lease only decides
*who tries* to lead; what makes a deposed leader harmless is the epoch it publishes with
(``scheduler.elected`` on the log fences older SJs), so a replica that loses its connection stops
acting and leaves.

The lock is never on the hot path: one poll per ``check`` interval, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import sqlalchemy as sa

from services.common.settings import DatabaseSettings

log = logging.getLogger(__name__)


class Lease:
    """One replica's claim on the scheduler lease; an async context manager."""

    def __init__(self, db: DatabaseSettings, name: str) -> None:
        # Scoped by database, so stacks (and test modules) sharing a server never contend.
        self.name = f"{name}:{db.name}"[:64]
        self._engine = sa.create_engine(db.url(), poolclass=sa.pool.NullPool)
        self._conn: sa.Connection | None = None

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def try_acquire(self) -> bool:
        """Take the lease if it is free (does not wait); True if this replica holds it."""
        return await asyncio.to_thread(self._try_acquire)

    async def held(self) -> bool:
        """Whether this replica still holds the lease (False if its connection broke)."""
        return await asyncio.to_thread(self._held)

    async def release(self) -> None:
        """Give the lease up (idempotent)."""
        await asyncio.to_thread(self._release)

    def _try_acquire(self) -> bool:
        if self._conn is None:
            self._conn = self._engine.connect()
        try:
            # GET_LOCK is re-entrant (MariaDB 10.0.2+, MySQL 5.7+): each call by the holder
            # counts, and RELEASE_LOCK undoes one. Taken only when not held already, so one
            # release frees it; a holder polling this would otherwise keep it until its
            # connection's end reached the server, after the release had returned (CI saw the
            # standby refused right after the holder's release).
            got = self._conn.execute(sa.text(
                "SELECT IF(IS_USED_LOCK(:n) <=> CONNECTION_ID(), 1, GET_LOCK(:n, 0))"),
                {"n": self.name}).scalar()
        except sa.exc.DBAPIError as e:
            log.warning("lease %s: %s", self.name, e)
            self._drop()
            return False
        return got == 1

    def _held(self) -> bool:
        if self._conn is None:
            return False
        try:
            mine = self._conn.execute(
                sa.text("SELECT IS_USED_LOCK(:n) = CONNECTION_ID()"), {"n": self.name}).scalar()
        except sa.exc.DBAPIError as e:
            log.warning("lease %s lost: %s", self.name, e)
            self._drop()
            return False
        return mine == 1

    def _release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.DBAPIError):  # a dead connection took the lock
                self._conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": self.name})
            self._drop()
        self._engine.dispose()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sa.exc.DBAPIError):
                conn.close()
