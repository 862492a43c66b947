"""Lower the CPU priority of the database server's threads that serve an engine's connections.

Why: on one machine, the projector's nice covers its own process but not the work it causes:
its inserts run in MariaDB's threads, at the server's priority, beside the request path. Each
connection of MariaDB and MySQL is served by one server thread (the default
one-thread-per-connection scheduler), whose kernel id the server tells: MariaDB's
``information_schema.PROCESSLIST.TID``, MySQL 8's ``performance_schema.threads.THREAD_OS_ID``.
When that thread belongs to a database server process this machine shows (its ``comm`` is
``mariadbd`` or ``mysqld``), its priority is lowered while the connection lives and given back
when the connection closes (the server then keeps the thread in its cache for another client).

A client killed before it closes (SIGKILL, the machine's OOM killer) leaves its threads
lowered in that cache, for whichever client the server hands them to next. So the priority is
always set relative to the server process's own (never to a thread's current one, which may be
such a leftover), and the first connection of each engine sweeps the cache: every thread of the
server lowered by exactly this engine's amount that serves no live connection gets the server's
priority back. Live connections are left alone (another process's lowered ones among them); a
connection that was handed a leftover before any sweep keeps it while it lives.
A server elsewhere, in another PID namespace or with neither column is left as it is: the
connection works the same, at the server's priority.

Where the kernel groups processes by session (autogroups), a thread's nice orders it only
against the threads of its own session: here, the server's other threads, those serving other
clients (ingest's queries) among them (docs/performance.md, "Priorities and the kernel's session
groups").
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa

log = logging.getLogger(__name__)

SERVER_COMMANDS = frozenset({"mariadbd", "mysqld"})
"""The process names of a database server whose threads may be reniced."""

_THREAD_QUERIES = (
    "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
    "SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()",
)

TID_KEY = "hs_server_tid"
"""Where a connection's info keeps its server thread and the server's priority (given back
when the connection closes)."""


def server_thread(dbapi_conn: Any) -> int | None:
    """The kernel id of the server thread serving this DB-API connection, when the server
    says (None otherwise)."""
    for query in _THREAD_QUERIES:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(query)
            row = cur.fetchone()
        except Exception:  # this server has no such column or table
            continue
        finally:
            cur.close()
        if row and row[0]:
            return int(row[0])
    return None


def _server_process(tid: int, proc: Path = Path("/proc")) -> int:
    """The process (thread group) of a thread."""
    status = (proc / str(tid) / "status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("Tgid:")))


def local_server_thread(tid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``tid`` is a thread of a database server process on this machine."""
    try:
        tgid = _server_process(tid, proc)
        return (proc / str(tgid) / "comm").read_text().strip() in SERVER_COMMANDS
    except (OSError, StopIteration, IndexError, ValueError):
        return False


_LIVE_QUERIES = (
    "SELECT TID FROM information_schema.PROCESSLIST",
    "SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID IS NOT NULL",
)


def live_server_threads(dbapi_conn: Any) -> set[int] | None:
    """The kernel ids of the server threads serving a connection now (every connection this
    client may see), or None when the server does not say."""
    for query in _LIVE_QUERIES:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(query)
            rows = cur.fetchall()
        except Exception:  # this server has no such column or table
            continue
        finally:
            cur.close()
        return {int(row[0]) for row in rows if row[0]}
    return None


def restore_left_over(server: int, base: int, lowered: int, live: set[int],
                      proc: Path = Path("/proc")) -> list[int]:
    """Give the server's priority ``base`` back to each thread of process ``server`` at
    ``lowered`` that serves no connection in ``live``; the threads restored."""
    restored: list[int] = []
    try:
        tids = [int(name) for name in os.listdir(proc / str(server) / "task")]
    except OSError:
        return restored
    for tid in tids:
        if tid in live or tid == server:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to change
            if os.getpriority(os.PRIO_PROCESS, tid) == lowered:
                os.setpriority(os.PRIO_PROCESS, tid, base)
                restored.append(tid)
    return restored


def nice_server_threads(engine: sa.Engine, nice: int) -> None:
    """Lower by ``nice`` (1-19) the priority of the local server thread of each connection
    ``engine`` opens, until that connection closes; the first connection first restores the
    threads a killed client left lowered by as much."""
    if nice <= 0:
        return
    told: list[bool] = []
    swept: list[bool] = []

    def tell_once(message: str, *args: object) -> None:
        if not told:
            told.append(True)
            log.info(message, *args)

    @sa.event.listens_for(engine, "connect")
    def _lower(dbapi_conn: Any, record: Any) -> None:
        tid = server_thread(dbapi_conn)
        if tid is None or not local_server_thread(tid):
            tell_once("the database's server threads are not on this machine: "
                      "its work for this process keeps the server's priority")
            return
        try:
            server = _server_process(tid)
            base = os.getpriority(os.PRIO_PROCESS, server)
            lowered = min(19, base + nice)
            if not swept:
                swept.append(True)
                live = live_server_threads(dbapi_conn)
                if live is not None:
                    restored = restore_left_over(server, base, lowered, live)
                    if restored:
                        log.info("gave %d database server threads left lowered by a killed "
                                 "client their priority back", len(restored))
            os.setpriority(os.PRIO_PROCESS, tid, lowered)
        except (OSError, StopIteration, IndexError, ValueError) as e:
            tell_once("cannot lower the priority of the database's server threads: %s", e)
            return
        record.info[TID_KEY] = (tid, base)

    @sa.event.listens_for(engine, "close")
    def _restore(dbapi_conn: Any, record: Any) -> None:
        lowered = record.info.pop(TID_KEY, None)
        if lowered is not None:
            tid, before = lowered
            with contextlib.suppress(OSError):  # the thread is gone (the server restarted)
                os.setpriority(os.PRIO_PROCESS, tid, before)
