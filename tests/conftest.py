"""Shared fixtures: a real Kafka-protocol broker and a fresh MariaDB database.

The broker is tansu (in memory) started on a free port once per session, unless
``HS_KAFKA_BOOTSTRAP`` names an existing broker (real Apache Kafka in docker-compose, say).
Each test module gets its own freshly migrated database, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from services.common import procs
from services.common.settings import (
    LOCAL_BROKER_FETCH_MAX_WAIT_MS,
    DatabaseSettings,
    LogSettings,
    load_settings,
)

# Property tests assert what the code does, never how long an example takes: this VM's speed
# moves by a factor of three from hour to hour, and CI shares it with whatever else runs. A
# deadline (Hypothesis's default: 200 ms an example) or the too-slow health check would fail
# a correct test at a slow hour. Speed is the benchmarks' business (bench/).
settings.register_profile("hailstream", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "hailstream"))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a running broker."""
    external = os.environ.get("HS_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    port = procs.free_port()
    log = Path(tmp_path_factory.mktemp("tansu")) / "tansu.log"
    proc = procs.spawn(procs.tansu_command(port, "memory://tansu/"), log_path=log)
    try:
        procs.wait_for_port(port, timeout=20, proc=proc, what="tansu")
        yield f"127.0.0.1:{port}"
    finally:
        procs.terminate(proc.pid)
        proc.wait(timeout=10)  # reaped already; this only tells the Popen object


@pytest.fixture
def log_settings(broker: str) -> LogSettings:
    """Log settings for one test: topics under a unique prefix, so tests never share data."""
    base = load_settings().log
    if not os.environ.get("HS_KAFKA_BOOTSTRAP"):  # our own tansu: see the setting's note
        base = msgspec_replace(base, fetch_max_wait_ms=LOCAL_BROKER_FETCH_MAX_WAIT_MS)
    return msgspec_replace(base, bootstrap_servers=broker, partitions=4,
                           topic_prefix=f"t{uuid.uuid4().hex[:10]}-")


def msgspec_replace(obj, **changes):  # type: ignore[no-untyped-def]
    import msgspec

    return msgspec.structs.replace(obj, **changes)


@pytest.fixture(scope="session")
def db_server() -> DatabaseSettings:
    """The MariaDB/MySQL server the tests use (HS_DB_* or 127.0.0.1:3306 root)."""
    settings = load_settings().db
    engine = sa.create_engine(settings.url(database=False))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as e:
        pytest.fail(f"MariaDB is not reachable at {settings.host}:{settings.port}: {e}")
    finally:
        engine.dispose()
    return settings


def _fresh_database(server: DatabaseSettings) -> DatabaseSettings:
    return msgspec_replace(server, name=f"hs_test_{uuid.uuid4().hex[:12]}")


def _drop(db: DatabaseSettings) -> None:
    engine = sa.create_engine(db.url(database=False))
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{db.name}`"))
    engine.dispose()


@pytest.fixture
def empty_db(db_server: DatabaseSettings) -> Iterator[DatabaseSettings]:
    """Settings naming a database that does not exist yet (dropped after the test)."""
    db = _fresh_database(db_server)
    try:
        yield db
    finally:
        _drop(db)


@pytest.fixture(scope="module")
def migrated_db(db_server: DatabaseSettings) -> Iterator[DatabaseSettings]:
    """A freshly migrated database for one test module."""
    from sql.migrate import apply_migrations

    db = _fresh_database(db_server)
    apply_migrations(db)
    try:
        yield db
    finally:
        _drop(db)
