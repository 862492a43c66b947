"""MariaDB for the local stack: use the one that runs, else start (or install) the machine's own.

The stack never manages a MariaDB it did not start; when it starts one it records that, and only
``down --with-db`` stops it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pymysql

from services.common.settings import DatabaseSettings

MARIADBD = "/usr/sbin/mariadbd"
DATADIR = Path("/var/lib/mysql")


def db_reachable(db: DatabaseSettings, *, timeout: float = 2.0) -> bool:
    """Whether the server accepts a connection with ``db``'s credentials (no database needed)."""
    try:
        conn = pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password,
                               connect_timeout=max(1, int(timeout)))
    except pymysql.err.MySQLError:
        return False
    conn.close()
    return True


def _run(cmd: list[str], say: Callable[[str], None]) -> None:
    say("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _running() -> bool:
    """Whether a mariadbd process runs (start-stop-daemon --status exits 0 then)."""
    result = subprocess.run(["start-stop-daemon", "--status", "--exec", MARIADBD],
                            stdin=subprocess.DEVNULL, capture_output=True, check=False)
    return result.returncode == 0


def _install(say: Callable[[str], None]) -> None:
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{MARIADBD} is missing and apt-get is not available: install MariaDB")
    _run(["apt-get", "update"], say)
    _run(["apt-get", "install", "-y", "mariadb-server"], say)


def _prepare_dirs(say: Callable[[str], None]) -> None:
    """Directories the Debian configuration expects; a fresh container may lack them."""
    try:
        mysql = pwd.getpwnam("mysql")
    except KeyError:
        return
    for d in (Path("/run/mysqld"), Path("/var/log/mysql")):
        if not d.exists():
            d.mkdir(parents=True)
            os.chown(d, mysql.pw_uid, mysql.pw_gid)
    if not (DATADIR / "mysql").exists():
        _run(["mariadb-install-db", "--user=mysql"], say)


def ensure_mariadb(db: DatabaseSettings, *, timeout: float, install: bool,
                   say: Callable[[str], None]) -> bool:
    """Make MariaDB answer on ``db.host:db.port``; return whether this call started it."""
    if db_reachable(db):
        return False
    if not Path(MARIADBD).exists():
        if not install:
            raise RuntimeError(f"MariaDB is not reachable at {db.host}:{db.port} and "
                               f"{MARIADBD} is missing (installation disabled)")
        _install(say)
        # The package's postinst may have started it (it may still be starting: wait below).
    elif _running():
        # Starting would be a no-op: the server runs but refuses us (port, user or password).
        raise RuntimeError(f"{MARIADBD} runs but does not accept {db.user}@{db.host}:{db.port}; "
                           "check the HS_DB_* settings")
    _prepare_dirs(say)
    _run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", MARIADBD], say)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db_reachable(db):
            return True
        time.sleep(0.5)
    raise TimeoutError(f"MariaDB did not accept connections on {db.host}:{db.port} within "
                       f"{timeout:.0f}s (see /var/log/mysql/error.log)")


def stop_mariadb(say: Callable[[str], None]) -> None:
    """Stop the machine's MariaDB (only called when the stack started it)."""
    _run(["start-stop-daemon", "--stop", "--oknodo", "--retry", "TERM/60/KILL/5", "--exec",
          MARIADBD], say)
