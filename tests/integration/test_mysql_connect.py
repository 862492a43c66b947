"""Engines made from the settings' URL share one TLS context among their PyMySQL connections
in PyMySQL's preferred mode, and still connect (this MariaDB offers no TLS); connections given
TLS options build their own."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import sqlalchemy as sa

from services.common import mysql
from services.common.settings import DatabaseSettings

pytestmark = pytest.mark.integration


def _ctx(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        raw = conn.connection.dbapi_connection
        assert isinstance(raw, mysql.Connection)
        return raw.ctx


def test_engines_share_one_context_in_preferred_mode(db_server: DatabaseSettings) -> None:
    engines = [sa.create_engine(db_server.url(database=False), poolclass=sa.pool.NullPool)
               for _ in range(2)]
    try:
        first, second, third = _ctx(engines[0]), _ctx(engines[1]), _ctx(engines[0])
    finally:
        for e in engines:
            e.dispose()
    assert isinstance(first, ssl.SSLContext)
    assert first is second is third
    assert first.verify_mode == ssl.CERT_NONE  # what PyMySQL's preferred mode sets
    assert first.check_hostname is False


def test_explicit_tls_options_get_their_own_context(db_server: DatabaseSettings) -> None:
    db_server.url()  # installs the hook
    conn = mysql.Connection(defer_connect=True, ssl={"verify_mode": False})
    shared = mysql.Connection(defer_connect=True)
    assert conn.ctx is not shared.ctx
    assert conn._ssl_required and not shared._ssl_required
