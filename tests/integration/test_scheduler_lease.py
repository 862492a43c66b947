"""The scheduler lease on the real MariaDB: one holder at a time, freed when its holder dies."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from services.common.settings import DatabaseSettings
from services.scheduler.lease import Lease

pytestmark = __import__("pytest").mark.integration


def test_one_holder_at_a_time_and_release_hands_over(migrated_db: DatabaseSettings) -> None:
    async def go() -> None:
        a, b = Lease(migrated_db, "test-lease"), Lease(migrated_db, "test-lease")
        async with a, b:
            assert await a.try_acquire() is True
            assert await a.try_acquire() is True  # re-entrant for its holder
            assert await b.try_acquire() is False
            assert await a.held() and not await b.held()
            await a.release()
            assert not await a.held()
            assert await b.try_acquire() is True and await b.held()

    asyncio.run(go())


def test_a_holder_polling_for_its_lease_holds_it_once(migrated_db: DatabaseSettings) -> None:
    """GET_LOCK is re-entrant: were each poll a hold, one RELEASE_LOCK would leave the lease
    held until the holder's connection ended on the server, after ``release`` returned."""
    async def go() -> None:
        a = Lease(migrated_db, "test-lease-poll")
        engine = sa.create_engine(migrated_db.url())
        try:
            async with a:
                for _ in range(5):  # a leader's polls
                    assert await a.try_acquire()
                assert a._conn is not None
                a._conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": a.name})
                with engine.connect() as conn:
                    assert conn.execute(sa.text("SELECT IS_FREE_LOCK(:n)"),
                                        {"n": a.name}).scalar() == 1
        finally:
            engine.dispose()

    asyncio.run(go())


def test_a_dead_holders_lease_is_free_at_once(migrated_db: DatabaseSettings) -> None:
    async def go() -> None:
        a, b = Lease(migrated_db, "test-lease-kill"), Lease(migrated_db, "test-lease-kill")
        async with a, b:
            assert await a.try_acquire()
            assert not await b.try_acquire()
            engine = sa.create_engine(migrated_db.url())
            with engine.connect() as conn:  # what a crash does: the server drops the session
                holder = conn.execute(sa.text("SELECT IS_USED_LOCK(:n)"),
                                      {"n": a.name}).scalar()
                conn.execute(sa.text(f"KILL {int(holder)}"))
            engine.dispose()
            assert not await a.held()  # the deposed holder finds out
            assert await b.try_acquire() and await b.held()

    asyncio.run(go())


def test_leases_of_different_databases_do_not_contend(migrated_db: DatabaseSettings) -> None:
    other = DatabaseSettings(host=migrated_db.host, port=migrated_db.port, user=migrated_db.user,
                             password=migrated_db.password, name=migrated_db.name + "_other")
    assert Lease(migrated_db, "x").name != Lease(other, "x").name
