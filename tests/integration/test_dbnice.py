"""The database server's threads that serve an engine's connections, lowered in priority while
the connections live (services.common.dbnice), against the real MariaDB of this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from services.common.dbnice import (
    TID_KEY,
    local_server_thread,
    nice_server_threads,
    server_thread,
)
from services.common.settings import (
    DatabaseSettings,
    bunch_slack,
    projector_db_nice,
)


def _tid(conn: sa.Connection) -> int:
    tid = server_thread(conn.connection.dbapi_connection)
    assert tid is not None, "the server tells no thread id for a connection"
    return tid


def test_a_connection_is_served_by_a_thread_of_the_local_server(
        db_server: DatabaseSettings) -> None:
    engine = sa.create_engine(db_server.url(database=False), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            tid = _tid(conn)
            assert local_server_thread(tid)
            assert not local_server_thread(os.getpid())  # this test's own process
    finally:
        engine.dispose()


def test_the_server_thread_is_lowered_while_the_connection_lives(
        db_server: DatabaseSettings) -> None:
    plain = sa.create_engine(db_server.url(database=False), poolclass=sa.pool.NullPool)
    lowered = sa.create_engine(db_server.url(database=False), pool_size=1, max_overflow=0)
    nice_server_threads(lowered, 7)
    try:
        with lowered.connect() as conn:
            tid, before = conn.connection.info[TID_KEY]
            assert tid == _tid(conn)
            assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, before + 7)
            with plain.connect() as other:  # another client's: another thread, untouched
                assert _tid(other) != tid
                assert TID_KEY not in other.connection.info
        with lowered.connect() as conn:  # the pool's connection again: still lowered
            assert _tid(conn) == tid
            assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, before + 7)
        lowered.dispose()  # closed: the server's thread gets its priority back
        assert os.getpriority(os.PRIO_PROCESS, tid) == before
    finally:
        lowered.dispose()
        plain.dispose()


def test_nothing_is_lowered_at_zero(db_server: DatabaseSettings) -> None:
    engine = sa.create_engine(db_server.url(database=False), poolclass=sa.pool.NullPool)
    nice_server_threads(engine, 0)
    try:
        with engine.connect() as conn:
            assert TID_KEY not in conn.connection.info
    finally:
        engine.dispose()


def test_only_a_database_server_thread_counts_as_local(tmp_path: Path) -> None:
    def thread(tid: int, tgid: int, comm: str) -> None:
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "status").write_text(f"Name:\tx\nTgid:\t{tgid}\nPid:\t{tid}\n")
        (tmp_path / str(tgid)).mkdir(exist_ok=True)
        (tmp_path / str(tgid) / "comm").write_text(comm + "\n")

    thread(101, 100, "mariadbd")
    thread(201, 200, "mysqld")
    thread(301, 300, "python3")
    assert local_server_thread(101, proc=tmp_path)
    assert local_server_thread(201, proc=tmp_path)
    assert not local_server_thread(301, proc=tmp_path)
    assert not local_server_thread(401, proc=tmp_path)  # no such thread here


def test_the_settings_refuse_what_they_cannot_take() -> None:
    assert projector_db_nice({}) == 0
    assert projector_db_nice({"HS_PROJECTOR_DB_NICE": "15"}) == 15
    for bad in ("low", "20", "-1"):
        with pytest.raises(ValueError, match="HS_PROJECTOR_DB_NICE"):
            projector_db_nice({"HS_PROJECTOR_DB_NICE": bad})
    assert bunch_slack("2048") == 2048
    with pytest.raises(ValueError, match="HS_INGEST_BUNCH_SLACK must be a whole number"):
        bunch_slack("lots")
    with pytest.raises(ValueError, match="HS_INGEST_BUNCH_SLACK must be 0 or more"):
        bunch_slack("-1")


def test_threads_a_killed_client_left_lowered_get_the_servers_priority_back(
        db_server: DatabaseSettings) -> None:
    """A client killed before it closed its connections leaves their threads lowered in the
    server's cache. The next engine's first connection gives them the server's priority back,
    never lowers a leftover it is handed twice over, and leaves live connections alone."""
    plain = sa.create_engine(db_server.url(database=False), poolclass=sa.pool.NullPool)
    other = sa.create_engine(db_server.url(database=False), pool_size=1, max_overflow=0)
    nice_server_threads(other, 7)
    lowered = sa.create_engine(db_server.url(database=False), pool_size=1, max_overflow=0)
    try:
        with other.connect() as live:  # another process's lowered connection, alive
            live_tid, base = live.connection.info[TID_KEY]
            # Two connections whose threads a killed client had lowered: closed without their
            # priority given back, the server keeps the threads for its next clients.
            left: list[int] = []
            with plain.connect() as a, plain.connect() as b:
                for conn in (a, b):
                    left.append(_tid(conn))
                    os.setpriority(os.PRIO_PROCESS, left[-1], base + 7)
            assert all(os.getpriority(os.PRIO_PROCESS, t) == base + 7 for t in left), \
                "the server did not keep the closed connections' threads"
            nice_server_threads(lowered, 7)
            with lowered.connect() as conn:
                tid, got_base = conn.connection.info[TID_KEY]
                assert got_base == base  # the server's, not a leftover thread's own
                assert os.getpriority(os.PRIO_PROCESS, tid) == base + 7  # not 14
                for t in left:
                    if t != tid:  # the one not handed to this connection: given back
                        assert os.getpriority(os.PRIO_PROCESS, t) == base
                assert os.getpriority(os.PRIO_PROCESS, live_tid) == base + 7  # left alone
            lowered.dispose()
            assert os.getpriority(os.PRIO_PROCESS, tid) == base
    finally:
        lowered.dispose()
        other.dispose()
        plain.dispose()
